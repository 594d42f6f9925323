"""Causal self-attention with grouped-query attention, heads split over the TP group."""
import math

from torch import nn

from .. import comm
from ..fusions import rope as rope_front
from ..fusions.attention import CoreAttention
from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from ..tensor_parallel.random import checkpoint


class SelfAttention(nn.Module):
    """[s(/TP with SP), b, h] -> same shape. Talks to the TP group `tp_group`.

    The fused QKV weight is laid out per query group, [q_1..q_k, k, v] for each group,
    so splitting its rows evenly over TP gives each rank whole groups. The attention core
    (scores, softmax, dropout, weighted sum) is CoreAttention, whose backend the fusion
    front picks; with --recompute-granularity selective it alone is recomputed in the
    backward pass: it holds the s x s activations, yet costs few of the layer's FLOPs.
    """

    def __init__(self, config, tp_group, device=None, layer_number=1):
        super().__init__()
        c = config
        tp = comm.world(tp_group)
        self.head_dim = c.kv_channels
        self.heads = c.num_attention_heads // tp
        self.groups = c.num_query_groups // tp
        self.recompute_core = c.recompute_granularity == "selective"
        self.rope_impl = rope_front.select(c.apply_rope_fusion, device or "cpu", c.params_dtype)
        qkv_size = (c.num_attention_heads + 2 * c.num_query_groups) * c.kv_channels
        out_std = c.init_method_std / math.sqrt(2.0 * c.num_layers)
        self.linear_qkv = ColumnParallelLinear(
            c.hidden_size, qkv_size, group=tp_group, bias=c.add_bias_linear, init_std=c.init_method_std,
            sequence_parallel=c.sequence_parallel, params_dtype=c.params_dtype, device=device)
        self.core_attention = CoreAttention(c, tp_group, layer_number, device)
        self.linear_proj = RowParallelLinear(
            c.num_attention_heads * c.kv_channels, c.hidden_size, group=tp_group, bias=c.add_bias_linear,
            init_std=out_std, sequence_parallel=c.sequence_parallel, params_dtype=c.params_dtype, device=device)

    def forward(self, x, rope=None, attn_mask=None):
        """x [s(/TP), b, h]; rope: (cos, sin) [s, 1, 1, d] or None; attn_mask: None = causal."""
        qkv, _ = self.linear_qkv(x)
        s, b = qkv.shape[:2]
        per_group = self.heads // self.groups
        qkv = qkv.view(s, b, self.groups, per_group + 2, self.head_dim)
        q = qkv[:, :, :, :per_group].reshape(s, b, self.heads, self.head_dim)
        k, v = qkv[:, :, :, per_group], qkv[:, :, :, per_group + 1]
        if rope is not None:
            q, k = (rope_front.apply_rope(t, *rope, impl=self.rope_impl) for t in (q, k))
        if self.recompute_core and self.training:
            out = checkpoint(self.core_attention, q, k, v, attn_mask)
        else:
            out = self.core_attention(q, k, v, attn_mask)
        return self.linear_proj(out)[0]
