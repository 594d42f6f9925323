"""FP8 flags (issue 28): Megatron-LM's names and defaults, what each layer runs, and one-line refusals of
what is not built or does not fit (the CLI turns a ConfigError into `error: ...`, exit 2)."""
import types

import pytest

from megatron.core.config import ConfigError
from megatron.core.fp8.config import fp8_layer
from megatron.core.fp8.scalers import DelayedScaler
from megatron.core.transformer.block import TransformerBlock
from megatron.training.config import unbuilt_flags as not_built
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from tests.functional.cli import run_cli
from tests.functional.test_bad_inputs import assert_one_error_line

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3"]


def _cfgs(args, world=1):
    model_cfg, train_cfg = parse_args(MOCK + args)
    resolve(model_cfg, train_cfg, world, lambda c: types.SimpleNamespace(vocab_size=c.null_vocab_size + 1))
    validate(model_cfg, train_cfg, world)
    return model_cfg, train_cfg


def test_megatron_defaults():
    cfg, _ = _cfgs([])
    assert (cfg.fp8_format, cfg.fp8_recipe, cfg.fp8_margin, cfg.fp8_amax_history_len, cfg.fp8_amax_compute_algo,
            cfg.first_last_layers_bf16, cfg.num_layers_at_start_in_bf16, cfg.num_layers_at_end_in_bf16) == \
        (None, "delayed", 0, 1, "most_recent", False, 1, 1)
    assert [fp8_layer(cfg, n) for n in range(1, 5)] == [None] * 4


def test_first_last_layers_bf16_and_the_layers_built():
    cfg, _ = _cfgs(["--fp8-format", "hybrid", "--first-last-layers-bf16", "--num-layers-at-end-in-bf16", "2",
                    "--fp8-amax-history-len", "3"])
    assert [fp8_layer(cfg, n) is not None for n in range(1, 5)] == [False, True, False, False]
    block = TransformerBlock(cfg, _plan_groups(cfg), device="meta")
    linears = [m for m in block.modules() if hasattr(m, "fp8")]
    assert [m.fp8 is not None for m in linears] == [False] * 4 + [True] * 4 + [False] * 8
    scalers = [m for m in block.modules() if isinstance(m, DelayedScaler)]
    assert len(scalers) == 12 and all(s.amax_history.shape == (3,) for s in scalers)


def _plan_groups(cfg):
    from megatron.training.config.resolve import parallel_layout
    return parallel_layout(cfg, _cfgs([])[1], 1).plan_groups(0)


@pytest.mark.parametrize("args,feature", [
    (["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"], "mxfp8"),
    (["--fp8-format", "hybrid", "--transformer-impl", "transformer_engine"], "fp8_te"),
])
def test_not_built_is_refused_in_one_line(args, feature):
    with pytest.raises(not_built.NotBuiltError) as e:
        parse_args(MOCK + args)
    assert [k for k, _ in e.value.features] == [feature] and "\n" not in str(e.value)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_fp8_experts_under_ep_are_built(tp, dispatcher):
    m, _ = _cfgs(["--fp8-format", "hybrid", "--num-experts", "4", "--expert-model-parallel-size", "2",
                  "--moe-token-dispatcher-type", dispatcher, "--tensor-model-parallel-size", str(tp)], world=2 * tp)
    assert m.fp8_format == "hybrid" and m.expert_model_parallel_size == 2 and m.tensor_model_parallel_size == tp


def test_mxfp8_without_fp8_changes_nothing():  # as in Megatron-LM: the recipe is read only with a format
    assert _cfgs(["--fp8-recipe", "mxfp8"])[0].fp8_format is None


BLOCK_MOE = ["--num-experts", "4", "--moe-token-dispatcher-type", "alltoall", "--moe-ffn-hidden-size", "256",
             "--disable-bias-linear"]


@pytest.mark.parametrize("args,match", [
    (["--fp8-margin", "-1"], "--fp8-margin must be >= 0"),
    (["--fp8-amax-history-len", "0"], "--fp8-amax-history-len must be >= 1"),
    (["--fp8-recipe", "blockwise", "--tensor-model-parallel-size", "2"], "multiple of 128"),
    # a CP chunk of 16 / 4 positions x 2 sequences is not whole 128-token tiles
    (["--fp8-recipe", "blockwise", "--context-parallel-size", "2", "--attention-dropout", "0"],
     "2 x CP sequence chunks \\(4 positions x --micro-batch-size 2 = 8 tokens\\)"),
    # the layers' TP shards are multiples of 128 at hidden 256; the output layer's padded vocabulary is 128 / 2
    (["--fp8-recipe", "blockwise", "--tensor-model-parallel-size", "2", "--fp8-output-layer", "--hidden-size", "256",
      "--make-vocab-size-divisible-by", "64"], "the padded vocabulary .* per rank splitting it \\(64, over 2\\)"),
    # the experts' and the shared expert's FFN split over (expert) TP
    (["--fp8-recipe", "blockwise", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--hidden-size", "256"]
     + BLOCK_MOE + ["--moe-ffn-hidden-size", "128"], "each expert's FFN .* \\(64, over 2\\)"),
    (["--fp8-recipe", "blockwise", "--expert-tensor-parallel-size", "2", "--hidden-size", "256"] + BLOCK_MOE
     + ["--moe-ffn-hidden-size", "128"], "each expert's FFN .* \\(64, over 2\\)"),
    (["--fp8-recipe", "blockwise", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--hidden-size", "256"]
     + BLOCK_MOE + ["--moe-shared-expert-intermediate-size", "128"], "--moe-shared-expert-intermediate-size .* \\(64"),
    # blockwise experts: a micro-batch's rows of an expert split over CP chunks, or over TP ranks that each route
    # their own tokens to replicated experts (folded at EP 1)
    (["--fp8-recipe", "blockwise", "--context-parallel-size", "2", "--attention-dropout", "0", "--seq-length", "512",
      "--hidden-size", "256"] + BLOCK_MOE, "blockwise experts need .* --context-parallel-size 2"),
    (["--fp8-recipe", "blockwise", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--hidden-size", "256",
      "--expert-tensor-parallel-size", "1"] + BLOCK_MOE, "blockwise experts need .* --expert-tensor-parallel-size 1"),
])
def test_values_that_do_not_fit(args, match):
    world = 2 if any(a in args for a in ("--tensor-model-parallel-size", "--context-parallel-size",
                                         "--expert-tensor-parallel-size")) else 1
    with pytest.raises(ConfigError, match=match):
        _cfgs(["--fp8-format", "hybrid"] + args, world)


@pytest.mark.parametrize("args,world", [
    (["--context-parallel-size", "2", "--attention-dropout", "0", "--seq-length", "512"], 2),  # chunks of 128
    (["--context-parallel-size", "2", "--attention-dropout", "0", "--seq-length", "256", "--micro-batch-size", "2"],
     2),
    (BLOCK_MOE + ["--expert-model-parallel-size", "2"], 2),
    (BLOCK_MOE + ["--tensor-model-parallel-size", "2", "--sequence-parallel"], 2),
    (BLOCK_MOE + ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1",
                  "--expert-model-parallel-size", "2"], 2),
])
def test_blockwise_layouts_whose_tiles_are_one_process_tiles(args, world):
    m, _ = _cfgs(["--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--hidden-size", "256"] + args, world)
    assert m.fp8_recipe == "blockwise"


@pytest.mark.parametrize("args,match", [
    (["--fp8-format", "hybrid"], "needs --use-distributed-optimizer"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--use-distributed-optimizer"], "blockwise is not built"),
])
def test_fp8_param_gather_refusals(args, match):
    with pytest.raises(ConfigError, match=match):
        _cfgs(["--fp8-param-gather"] + args)


@pytest.mark.parametrize("sharding", [["--use-distributed-optimizer"], ["--data-parallel-sharding-strategy",
                                                                        "optim_grads_params"]])
def test_fp8_param_gather_is_built(sharding):  # Megatron-LM's default: off; without FP8 on the no-effect line
    from megatron.training.config import no_effect_flags as no_effect
    model_cfg, train_cfg = _cfgs(["--fp8-param-gather"])
    assert ("--fp8-param-gather", "without --fp8-format no weight is FP8 (the FP8 linears' weights are what it "
            "gathers)") in no_effect.accepted(model_cfg, train_cfg)
    assert not _cfgs([])[0].fp8_param_gather
    model_cfg, train_cfg = _cfgs(["--fp8-format", "hybrid", "--fp8-param-gather"] + sharding)
    assert model_cfg.fp8_param_gather and train_cfg.ddp_config(model_cfg.fp8_param_gather).fp8_param_gather


def test_cli_refusal_is_one_error_line_exit_2():
    proc = run_cli(MOCK + ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], check=False, timeout=120)
    assert_one_error_line(proc, "MXFP8 scaling")


def test_moe_fp8_state_is_checkpoint_state_with_layout_free_keys():
    from megatron.core.tensor_parallel.param_meta import set_init_key
    from megatron.core.transformer.model_state import non_trained_state
    cfg, _ = _cfgs(["--fp8-format", "hybrid", "--num-experts", "2", "--moe-router-topk", "1", "--num-layers", "2"])
    block = TransformerBlock(cfg, _plan_groups(cfg), device="meta")
    for name, p in block.named_parameters():  # as the language model names them (language_module.py)
        set_init_key(p, "decoder." + name)
    keys = [k for k, _ in non_trained_state(block)]
    assert len(keys) == len(set(keys)) == 2 * (2 + 2 * 2) * 3 * 3  # layers x (QKV, proj, 2 experts x 2) x 3 x 3
    assert "decoder.layers.0.mlp.experts.local_experts.1.fc2_fp8.grad.amax_history" in keys, keys[:3]


@pytest.mark.parametrize("untie", [False, True])
def test_fp8_output_layer_state_has_one_layout_free_key(untie):
    """--fp8-output-layer (an opt-in addition; off by default as Megatron-LM): the output GEMM's delayed-scaling
    state is saved as output_layer.fp8.* whether the table is tied (the model's own recipe) or not (the layer's)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.model_state import non_trained_state
    flags = ["--fp8-format", "hybrid", "--num-layers", "1"]
    flags += ["--untie-embeddings-and-output-weights"] if untie else []
    assert not _cfgs(flags)[0].fp8_output_layer
    without = GPTModel(_cfgs(flags)[0], _plan_groups(_cfgs(flags)[0]), device="meta")
    cfg = _cfgs(flags + ["--fp8-output-layer"])[0]
    model = GPTModel(cfg, _plan_groups(cfg), device="meta")
    keys = [k for k, _ in non_trained_state(model)]
    out = [k for k in keys if k.startswith("output_layer.fp8.")]
    assert len(out) == 9 and "output_layer.fp8.weight.amax_history" in out, out  # 3 tensors x 3 buffers
    assert len(keys) == len(non_trained_state(without)) + 9


@pytest.mark.parametrize("extra,world", [
    (["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1"], 2),
    (["--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2"], 4),
    (["--expert-model-parallel-size", "2", "--context-parallel-size", "3", "--seq-length", "48",
      "--attention-dropout", "0"], 6),
    # padded to capacity: per micro-batch, as one process pads each (capacity.places_by_micro_batch)
    (["--expert-model-parallel-size", "2", "--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"],
     2),
    (["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1",
      "--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"], 2),
])
def test_fp8_experts_folded_padded_or_beside_any_cp_are_built(extra, world):
    m, _ = _cfgs(["--fp8-format", "hybrid", "--num-experts", "4", "--moe-token-dispatcher-type", "alltoall"] + extra,
                 world=world)
    assert m.fp8_format == "hybrid" and m.num_experts == 4
