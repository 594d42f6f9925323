"""The memory estimate's FP8 term (training/planner/fp8_memory.py) against the bytes autograd keeps:
a 2-layer block's forward measured with and without FP8 (tests/activation_memory.py: storages once,
parameters excluded), one process and TP2 with sequence parallelism, the paper's unfused attention core.
Beyond the formula each FP8 linear keeps its fp32 scales: tensorwise x's and W's (8 bytes), blockwise W's
per 128x128 block."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer.block import TransformerBlock
from megatron.training.planner.fp8_memory import fp8_delta_bytes, fp8_delta_bytes_per_layer
from tests.activation_memory import measure
from tests.harness import spawn

S, B, H, A, LAYERS = 64, 2, 128, 4, 2


def _scale_bytes(recipe, t):
    if recipe == "tensorwise":
        return 4 * 8  # 4 linears x (x's 1/scale, W's scale) x 4 bytes
    shards = [(3 * H // t, H), (H, H // t), (4 * H // t, H), (H, 4 * H // t)]  # QKV, proj, fc1, fc2 [N, K]
    return sum(4 * -(-n // 128) * -(-k // 128) for n, k in shards)


def _config(t, sp, recipe):
    cfg = TransformerConfig(tensor_model_parallel_size=t, sequence_parallel=sp, num_layers=LAYERS, hidden_size=H,
                            num_attention_heads=A, seq_length=S, hidden_dropout=0.0, attention_dropout=0.0,
                            attention_backend="unfused", vocab_size=64, fp8_format=recipe and "hybrid",
                            fp8_recipe=recipe or "delayed")
    return cfg.resolve()


def _saved(groups, cfg):
    model_parallel_seed(1, groups.tp_rank, 0, "cpu")
    block = TransformerBlock(cfg, groups, post_process=False).train()
    t = groups.tp_size
    x = torch.randn(S // (t if cfg.sequence_parallel else 1), B, H, requires_grad=True)
    y, saved = measure(lambda: block(x), list(block.parameters()))
    y.sum().backward()
    return saved / LAYERS


def _deltas(groups, sp):
    t = groups.tp_size
    plain = _saved(groups, _config(t, sp, None))
    return {r: _saved(groups, _config(t, sp, r)) - plain for r in ("tensorwise", "blockwise")}


@pytest.mark.parametrize("t,sp", [(1, False), (2, True)])
def test_fp8_saved_bytes_match_the_estimate(t, sp):
    measured = spawn(t, _deltas, sp, tp=t, timeout=300)
    for recipe in ("tensorwise", "blockwise"):
        cfg = _config(t, sp, recipe)
        expected = fp8_delta_bytes_per_layer(cfg, B, t, sp) + _scale_bytes(recipe, t)
        for got in measured:
            assert got[recipe] == expected, (recipe, got[recipe], expected)
    if t == 1:  # FP8 keeps fewer bytes: 1-byte inputs instead of fp32
        assert measured[0]["tensorwise"] < 0


def test_first_last_layers_bf16_count_only_fp8_layers():
    cfg = _config(1, False, "tensorwise")
    cfg.num_layers, cfg.first_last_layers_bf16 = 4, True
    assert fp8_delta_bytes(cfg, B, 1, False) == fp8_delta_bytes_per_layer(cfg, B, 1, False) * 2 / 4
