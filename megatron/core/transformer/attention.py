"""Causal self-attention with grouped-query attention, heads split over the TP group."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import comm
from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from ..tensor_parallel.random import get_rng_tracker
from .rope import apply_rope


class SelfAttention(nn.Module):
    """[s(/TP with SP), b, h] -> same shape. Talks to the TP group `tp_group`.

    The fused QKV weight is laid out per query group, [q_1..q_k, k, v] for each group,
    so splitting its rows evenly over TP gives each rank whole groups.
    """

    def __init__(self, config, tp_group, device=None):
        super().__init__()
        c = config
        tp = comm.world(tp_group)
        self.head_dim = c.kv_channels
        self.heads = c.num_attention_heads // tp
        self.groups = c.num_query_groups // tp
        self.dropout = c.attention_dropout
        qkv_size = (c.num_attention_heads + 2 * c.num_query_groups) * c.kv_channels
        out_std = c.init_method_std / math.sqrt(2.0 * c.num_layers)
        self.linear_qkv = ColumnParallelLinear(
            c.hidden_size, qkv_size, group=tp_group, bias=c.add_bias_linear, init_std=c.init_method_std,
            sequence_parallel=c.sequence_parallel, params_dtype=c.params_dtype, device=device)
        self.linear_proj = RowParallelLinear(
            c.num_attention_heads * c.kv_channels, c.hidden_size, group=tp_group, bias=c.add_bias_linear,
            init_std=out_std, sequence_parallel=c.sequence_parallel, params_dtype=c.params_dtype, device=device)

    def forward(self, x, rope=None, attn_mask=None):
        qkv, _ = self.linear_qkv(x)
        s, b = qkv.shape[:2]
        per_group = self.heads // self.groups
        qkv = qkv.view(s, b, self.groups, per_group + 2, self.head_dim)
        q = qkv[:, :, :, :per_group].reshape(s, b, self.heads, self.head_dim)
        k, v = qkv[:, :, :, per_group], qkv[:, :, :, per_group + 1]
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        # SDPA wants [b, heads, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        kwargs = dict(attn_mask=attn_mask, is_causal=attn_mask is None, dropout_p=p)
        if self.groups != self.heads:
            kwargs["enable_gqa"] = True
        if p > 0:
            with get_rng_tracker().fork():  # heads differ per TP rank: so must their dropout
                out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        else:
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        out = out.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim)
        return self.linear_proj(out)[0]
