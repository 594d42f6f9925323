"""The MoE layer's saved activations (megatron/training/planner/moe_activations.py): the formula
written out here for one layer, equal to the bytes autograd saves at one process (bf16 and fp32, GeLU
and SwiGLU, plain / gated shared experts), and what the memory estimator adds for MoE layers."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.placement import one_rank
from megatron.training.planner import activations
from megatron.training.planner import moe_activations as am
from tests.activation_memory import measure

S, B, H, E, K, F = 64, 2, 64, 4, 2, 96
T = S * B


def _config(dtype=torch.bfloat16, **kw):
    return TransformerConfig(num_layers=2, hidden_size=H, num_attention_heads=4, seq_length=S, num_experts=E,
                             moe_router_topk=K, moe_ffn_hidden_size=F, add_bias_linear=False, params_dtype=dtype,
                             vocab_size=100, **kw).resolve()


def test_formula_written_out():
    # bf16, GeLU experts, no TP: input 2 T h, dropout mask T h, router 4 T E + 12 T k,
    # per pair 2 h + 2 (f + f) + 2 x 2 h + 16 + 2
    want = 2 * T * H + T * H + 4 * T * E + 12 * T * K + K * T * (2 * H + 4 * F + 4 * H + 18)
    assert am.moe_mlp_bytes(_config(), T) == want
    # SwiGLU (fc1 2f, silu f, product f) with a gated shared expert of 80 at TP 2 + SP (expert TP = TP)
    c = _config(swiglu=True, moe_shared_expert_intermediate_size=80, moe_shared_expert_gate=True,
                tensor_model_parallel_size=2, sequence_parallel=True)
    want = (2 * T * H + T * H / 2 + 4 * T * E + 12 * T * K + K * T * (2 * H + 2 * 4 * F / 2 + 4 * H + 18)
            + T * 2 * 4 * 80 / 2 + 2 * T * H / 2 + 2 * T)
    assert am.moe_mlp_bytes(c, T, tp=2, sp=True) == want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kw", [{}, {"swiglu": True},
                                {"swiglu": True, "moe_shared_expert_intermediate_size": 96,
                                 "moe_shared_expert_gate": True},
                                {"moe_shared_expert_intermediate_size": 80}])
def test_formula_is_what_autograd_saves(dtype, kw):
    c = _config(dtype, **kw)
    layer = MoELayer(c, one_rank(), 1, device="cpu")
    torch.manual_seed(0)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randn(S, B, H, dtype=dtype, requires_grad=True)
    _, saved = measure(lambda: layer(x), list(layer.parameters()))
    mask = T * H * dtype.itemsize / 2  # the dropout mask, kept by the layer around the MoE block
    assert saved == am.moe_mlp_bytes(c, T, act=dtype.itemsize) - mask


def test_estimate_memory_counts_moe_layers():
    est = activations
    dense = _config(swiglu=True, attention_backend="unfused")  # the paper's attention core (s x s scores kept)
    dense.num_experts = None
    korthikanti = S * B * H * (34 + 5 * 4 * S / H)
    assert est.activation_bytes_per_layer(dense, B, 1, False) == korthikanti  # dense: unchanged
    moe = _config(swiglu=True, moe_layer_freq=2, attention_backend="unfused")  # layer 1 of 2 is MoE
    extra = (am.moe_mlp_bytes(moe, T) - 19 * T * H) / 2
    assert est.activation_bytes_per_layer(moe, B, 1, False) == pytest.approx(korthikanti + extra)
