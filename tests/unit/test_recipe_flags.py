"""Megatron-LM recipe flags at the command line (issue 31): features not built refused in one line naming
each, switches without effect named at start-up, the value forms Megatron-LM accepts, the process-level
switches (manual GC, empty cache, bf16 matmul precision) and --attention-backend fused without TE."""
import argparse
import types

import pytest
import torch

from megatron.core.config import ConfigError
from megatron.core.fusions import attention as attention_front
from megatron.core.transformer.moe.layer_pattern import every_n, moe_freq
from megatron.training.config import no_effect_flags as no_effect
from megatron.training.config import unbuilt_flags as not_built
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.loop.runtime_switches import ManualGC, empty_unused_memory, set_matmul_precision

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "4", "--lr", "1e-3"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2"]


def _cfgs(args, world=1, vocab=None):
    model_cfg, train_cfg = parse_args(MOCK + args)
    resolve(model_cfg, train_cfg, world, lambda c: types.SimpleNamespace(vocab_size=vocab or c.null_vocab_size + 1))
    validate(model_cfg, train_cfg, world)
    return model_cfg, train_cfg


def test_not_built_flags_are_one_line_naming_every_feature():
    with pytest.raises(not_built.NotBuiltError) as e:
        parse_args(MOCK + MOE + ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8",
                                 "--moe-token-dispatcher-type", "flex", "--softmax-type", "learnable"])
    line = str(e.value)
    assert "\n" not in line and line.startswith("not built here: ")
    assert [k for k, _ in e.value.features] == ["mxfp8", "flex", "sinks"]
    for fragment in ("MXFP8 scaling (Blackwell's MX formats) (--fp8-recipe mxfp8; issue 28)",
                     "--moe-token-dispatcher-type flex", "--softmax-type"):
        assert fragment in line
    # their defaults change nothing: accepted
    parse_args(MOCK + ["--softmax-type", "vanilla", "--glu-linear-offset", "0.0"])


def test_a_feature_that_lands_takes_its_flag_over():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp8-format", dest="fp8_format")  # a built feature's own field
    not_built.add_flags(parser)
    assert parser.parse_args(["--fp8-format", "e4m3"]).fp8_format == "e4m3"
    assert not hasattr(parser.parse_args([]), "not_built_fp8_format")


@pytest.mark.parametrize("module,match", [("shared_experts", "shared_experts"), ("moe_act", "moe_act")])
def test_recompute_modules_not_built_are_refused(module, match):
    with pytest.raises(not_built.NotBuiltError, match=match):
        parse_args(MOCK + ["--recompute-granularity", "selective", "--recompute-modules", "mlp", module])


def test_unknown_recompute_module_and_mismatched_flags():
    with pytest.raises(ConfigError, match="--recompute-modules bogus: not a module name"):
        _cfgs(["--recompute-granularity", "selective", "--recompute-modules", "bogus"])
    with pytest.raises(ConfigError, match="goes with --recompute-granularity selective"):
        _cfgs(["--recompute-modules", "mlp"])
    m, _ = _cfgs(["--recompute-activations"])
    assert (m.recompute_granularity, m.recompute_modules) == ("selective", ["core_attn"])


def test_no_effect_flags_are_named_at_start_up_with_the_reason():
    m, t = _cfgs(MOE + ["--use-nccl-ub", "--moe-permute-fusion", "--use-flash-attn", "--num-workers", "1",
                        "--moe-router-score-function", "sigmoid", "--moe-router-pre-softmax",
                        "--no-create-attention-mask-in-dataloader", "--enable-experimental"])
    line = no_effect.line(m, t, torch.device("cpu"))
    for flag in ("--use-nccl-ub", "--moe-permute-fusion", "--use-flash-attn", "--num-workers",
                 "--moe-router-pre-softmax", "--no-create-attention-mask-in-dataloader", "--enable-experimental"):
        assert flag + " (" in line
    assert line.startswith("> accepted, no effect here: ") and "\n" not in line
    assert no_effect.line(*_cfgs([])) is None


@pytest.mark.parametrize("split", ["'99,1,0'", "99 1 0", "99,1,0,", "99,1"])
def test_split_forms_megatron_accepts(split):
    _cfgs(["--split", split])


def test_vocab_size_beside_a_huggingface_tokenizer_is_megatrons_no_op():
    args = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tok", "--vocab-size", "128256"]
    m, t = parse_args([a for a in MOCK if a not in ("--mock-data",)][2:] + ["--data-path", "x"] + args)
    resolve(m, t, 1, lambda c: types.SimpleNamespace(vocab_size=300))
    validate(m, t, 1)
    assert m.vocab_size == 300  # the tokenizer's
    assert "--vocab-size (" in no_effect.line(m, t)


def test_moe_layer_freq_expressions():
    assert moe_freq("([1]+[0])*2") == [1, 0, 1, 0] and moe_freq("2") == 2
    assert every_n([1, 0, 1, 0], 4) == 2 and every_n([1, 1, 1, 1], 4) == 1 and every_n([1, 0, 0, 0], 4) == 4
    assert every_n([0, 1, 0, 1], 4) is None and every_n([1, 0, 1], 4) is None
    m, _ = _cfgs(MOE + ["--moe-layer-freq", "([1]+[0])*2"])
    assert m.moe_layer_freq == 2 and [m.is_moe_layer(n) for n in (1, 2, 3, 4)] == [True, False, True, False]
    m, _ = _cfgs(MOE + ["--moe-layer-freq", "([0]*3+[1])"])  # dense first (DeepSeek-V3's shape)
    assert m.moe_layer_freq == [0, 0, 0, 1] and [m.is_moe_layer(n) for n in (1, 2, 3, 4)] == [False] * 3 + [True]
    with pytest.raises(ConfigError, match="--moe-layer-freq"):
        parse_args(MOCK + MOE + ["--moe-layer-freq", "__import__('os')"])
    with pytest.raises(ConfigError, match="gives 3 layers but --num-layers is 4"):
        _cfgs(MOE + ["--moe-layer-freq", "[1]*3"])


def test_several_balance_losses_each_with_its_coefficient():
    m, _ = _cfgs(MOE + ["--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                        "--moe-aux-loss-coeff", "1e-2", "1e-3"])
    assert m.balance_losses() == [("aux_loss", 1e-2, "load_balancing_loss"),
                                  ("seq_aux_loss", 1e-3, "seq_load_balancing_loss")]
    m, _ = _cfgs(MOE + ["--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2"])
    assert m.balance_losses() == [("seq_aux_loss", 1e-2, "load_balancing_loss")]  # one type: as before
    with pytest.raises(ConfigError, match="one coefficient per type"):
        _cfgs(MOE + ["--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2"])


def test_megatron_fsdp_maps_onto_zero3():
    _, t = _cfgs(["--use-megatron-fsdp", "--bf16", "--megatron-fsdp-grad-comm-dtype", "bf16",
                  "--megatron-fsdp-main-grads-dtype", "bf16", "--ckpt-format", "fsdp_dtensor"], world=2)
    assert t.data_parallel_sharding_strategy == "optim_grads_params" and t.grad_reduce_in_bf16
    assert t.use_distributed_optimizer
    with pytest.raises(ConfigError, match="different dtypes is not built"):
        _cfgs(["--use-megatron-fsdp", "--bf16", "--megatron-fsdp-main-grads-dtype", "fp32",
               "--megatron-fsdp-grad-comm-dtype", "bf16"])
    with pytest.raises(ConfigError, match="--ckpt-format fsdp_dtensor"):
        _cfgs(["--ckpt-format", "fsdp_dtensor"])  # without Megatron-FSDP, as Megatron-LM


class _FakeGC:
    def __init__(self):
        self.calls = []

    def disable(self):
        self.calls.append("disable")

    def enable(self):
        self.calls.append("enable")

    def collect(self, generation=2):
        self.calls.append(f"collect{generation}")


def test_manual_gc_collects_at_fixed_points():
    fake = _FakeGC()
    gc = ManualGC(types.SimpleNamespace(manual_gc=True, manual_gc_interval=2, manual_gc_eval=True), fake)
    gc.start()
    for it in range(1, 5):
        gc.after_iteration(it)
    gc.before_evaluation()
    gc.after_evaluation()
    gc.finish()
    assert fake.calls == ["disable", "collect2", "collect2", "collect2", "collect2", "collect0", "enable"]
    off = _FakeGC()
    ManualGC(types.SimpleNamespace(manual_gc=False, manual_gc_interval=2, manual_gc_eval=True), off).start()
    assert off.calls == []
    import gc as real
    manual = ManualGC(types.SimpleNamespace(manual_gc=True, manual_gc_interval=0, manual_gc_eval=False))
    manual.start()
    try:
        assert not real.isenabled()
    finally:
        manual.finish()
    assert real.isenabled()


def test_empty_cache_levels_and_matmul_precision():
    calls = []
    for level in (0, 1, 2):
        for at_least in (1, 2):
            empty_unused_memory(level, at_least, torch.device("cuda"), lambda: calls.append((level, at_least)))
            empty_unused_memory(level, at_least, torch.device("cpu"), lambda: calls.append("cpu"))
    assert calls == [(1, 1), (2, 1), (2, 2)]
    backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(
        allow_bf16_reduced_precision_reduction=True)))
    for bf16, want in ((False, True), (True, False)):
        m = types.SimpleNamespace(disable_bf16_reduced_precision_matmul=True)
        set_matmul_precision(m, types.SimpleNamespace(bf16=bf16), backends)
        assert backends.cuda.matmul.allow_bf16_reduced_precision_reduction is want


def test_fused_attention_without_te_runs_sdpa_with_cudnn_first():
    assert attention_front.select_fused("cpu", torch.float32) == "sdpa"
    te = attention_front.available("te", "cuda", torch.bfloat16)[0]
    assert attention_front.select_fused("cuda", torch.bfloat16) == ("te" if te else "cudnn")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 2, 4, 8, generator=g) for _ in range(3))
    assert torch.equal(attention_front.sdpa_cudnn(q, k, v, None, 0.0), attention_front.sdpa(q, k, v, None, 0.0))
    m, _ = _cfgs(["--attention-backend", "fused"])  # not refused without Transformer Engine
    from megatron.core import fusions
    assert "no Transformer Engine" in dict(fusions.describe(m, torch.device("cpu")))["attention"]


def test_mla_up_proj_recompute_needs_multi_latent_attention():
    with pytest.raises(ConfigError, match="mla_up_proj .* needs --multi-latent-attention"):
        _cfgs(["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"])


def test_latent_attention_and_mtp_settings_without_their_feature_are_named_without_effect():
    m, t = _cfgs(["--rotary-scaling-factor", "40", "--kv-lora-rank", "64", "--mtp-loss-scaling-factor", "0.3"])
    named = {flag for flag, _ in no_effect.accepted(m, t)}
    assert {"--rotary-scaling-factor", "--kv-lora-rank", "--mtp-loss-scaling-factor"} <= named
    m, t = _cfgs(["--position-embedding-type", "rope", "--multi-latent-attention", "--rotary-scaling-factor", "40"])
    assert "--rotary-scaling-factor" not in {flag for flag, _ in no_effect.accepted(m, t)}
