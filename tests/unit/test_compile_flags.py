"""--compile-layers refuses, in one line before any group is built, what it cannot run with; without the
flag nothing changes; the flag is ours in --help."""
import types

import pytest

from megatron.core.config import ConfigError
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3"]


def _validate(args, world_size):
    model_cfg, train_cfg = parse_args(MOCK + args)
    resolve(model_cfg, train_cfg, world_size, lambda cfg: types.SimpleNamespace(vocab_size=101))
    return validate(model_cfg, train_cfg, world_size)


REFUSED = {
    "zero-bubble": (["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"], 2,
                    "--compile-layers with --pipeline-schedule zb-h1: a compiled layer's backward is one autograd "
                    "node"),
    "fp8": (["--fp8-format", "e4m3"], 1, "--compile-layers with --fp8-format is not built"),
    "zero3": (["--data-parallel-sharding-strategy", "optim_grads_params"], 2,
              "--compile-layers with --data-parallel-sharding-strategy optim_grads_params (ZeRO-3) is not built"),
    "overlap-param-gather": (["--use-distributed-optimizer", "--overlap-param-gather"], 2,
                             "--compile-layers with --overlap-param-gather is not built"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_compile_layers_refuses_in_one_line(case):
    args, world, expected = REFUSED[case]
    _validate(args, world)  # fine without the flag
    with pytest.raises(ConfigError) as e:
        _validate(args + ["--compile-layers"], world)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)


def test_compile_layers_fits_recompute_pp_tp_and_moe():
    for args, world in ((["--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                          "--recompute-method", "uniform"], 2),
                        (["--tensor-model-parallel-size", "2", "--sequence-parallel"], 2),
                        (["--num-experts", "2", "--expert-model-parallel-size", "2"], 2)):
        _validate(args + ["--compile-layers"], world)


def test_compile_layers_is_named_ours_in_help(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--compile-layers This project's (not in Megatron-LM)" in text
