"""Standard attention's per-head q/k norms (--qk-layernorm) on paper: the bytes the estimator adds
(planner/activations.qk_norm_bytes) are what autograd keeps beyond the same layer without them, at one process."""
import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.config import TransformerConfig
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.rope import rope_cos_sin
from megatron.training.planner import activations
from tests.activation_memory import cpu_qk_norm_extra, measure

S, B, H, D = 16, 2, 32, 12


def _saved(qk_layernorm, dtype):
    c = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=4, group_query_attention=True,
                          num_query_groups=2, kv_channels=D, seq_length=S, position_embedding_type="rope",
                          normalization="RMSNorm", qk_layernorm=qk_layernorm, attention_dropout=0.0,
                          add_bias_linear=False, params_dtype=dtype).resolve()
    torch.manual_seed(0)
    m = SelfAttention(c, PlanGroup(1, 0), device="cpu").train()
    x = torch.randn(S, B, H, dtype=dtype, requires_grad=True)
    rope = rope_cos_sin(S, D, 10000, "cpu", dtype)  # one table per model: not the layer's
    y, saved = measure(lambda: m(x, rope), list(m.parameters()) + list(rope))
    y.float().sum().backward()
    return c, saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_bytes_are_what_autograd_keeps(dtype):
    (_, without), (c, with_norms) = _saved(False, dtype), _saved(True, dtype)
    added = activations.qk_norm_bytes(c, S * B, 1)
    assert added > 0 and with_norms - without == added + S * B * cpu_qk_norm_extra(c, dtype.itemsize)
    assert activations.qk_norm_bytes(c, S * B, 2) == added / 2  # this rank's heads
