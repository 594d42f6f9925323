"""Megatron-LM's precision-aware optimizer flags: each combination that cannot work is one line naming the
flags and the fix, before any group is built; the working ones resolve (bf16 main grads: bf16 gradient
buffers) and the CLI says what runs."""
import types

import pytest

from megatron.core.config import ConfigError
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from tests.functional.cli import run_cli

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0"]
ON = ["--use-precision-aware-optimizer", "--use-distributed-optimizer"]


def _validate(args, world_size=1):
    model_cfg, train_cfg = parse_args(MOCK + args)
    resolve(model_cfg, train_cfg, world_size, lambda cfg: types.SimpleNamespace(vocab_size=101))
    validate(model_cfg, train_cfg, world_size)
    return train_cfg


REFUSED = {
    "dtype without the flag": (["--exp-avg-dtype", "bf16"], "--exp-avg-dtype bf16 needs --use-precision-aware-"
                                                           "optimizer"),
    "main grads without the flag": (["--bf16", "--main-grads-dtype", "bf16"], "--main-grads-dtype bf16 needs"),
    "no distributed optimizer": (["--use-precision-aware-optimizer"], "--use-precision-aware-optimizer needs the "
                                                                      "distributed optimizer"),
    "sgd": (ON + ["--optimizer", "sgd"], "--use-precision-aware-optimizer is built for --optimizer adam only"),
    "fp8 moments": (ON + ["--exp-avg-sq-dtype", "fp8"], "--exp-avg-sq-dtype fp8 is not built here"),
    "offload": (ON + ["--optimizer-cpu-offload"], "--optimizer-cpu-offload with --use-precision-aware-optimizer is "
                                                  "not built"),
    "bf16 grads of fp16 loss scaling": (ON + ["--fp16", "--main-grads-dtype", "bf16"], "--main-grads-dtype bf16 "
                                                                                       "needs --bf16"),
    "bf16 grads with fp32 accumulation": (ON + ["--bf16", "--main-grads-dtype", "bf16",
                                                "--accumulate-allreduce-grads-in-fp32"],
                                          "--main-grads-dtype can only be fp32 with --accumulate-allreduce"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_precision_aware_misfits_are_one_line(case):
    args, expected = REFUSED[case]
    with pytest.raises(ConfigError) as e:
        _validate(args)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)


def test_bf16_main_grads_are_bf16_gradient_buffers():
    cfg = _validate(ON + ["--bf16", "--main-grads-dtype", "bf16", "--exp-avg-dtype", "bf16", "--main-params-dtype",
                          "fp16"])
    assert cfg.grad_reduce_in_bf16 and cfg.ddp_config().grad_reduce_in_bf16
    assert [str(d) for d in cfg.optimizer_dtypes()] == ["torch.float16", "torch.bfloat16", "torch.float32"]
    assert _validate([]).optimizer_dtypes() is None


def test_cli_refusal_is_one_line_exit_2_and_a_run_names_the_step():
    proc = run_cli(MOCK + ["--use-precision-aware-optimizer"], check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "--use-distributed-optimizer" in errors[0], proc.stderr
    proc = run_cli(MOCK + ON + ["--bf16", "--exp-avg-sq-dtype", "bf16"])
    assert ("> precision-aware optimizer: main grads fp32, main params fp32, exp_avg fp32, exp_avg_sq bf16; the "
            "Python reference step (not a CUDA device)") in proc.stdout
