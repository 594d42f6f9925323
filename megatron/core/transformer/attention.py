"""Causal self-attention with grouped-query attention, heads split over the TP group."""
import math

import torch
from torch import nn

from .. import comm
from ..fp8.config import fp8_layer
from ..fusions import rope as rope_front
from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from ..tensor_parallel.param_meta import set_qkv_split
from ..tensor_parallel.random import checkpoint
from .core_attention import CoreAttention
from .kv_cache import causal_mask_after
from .model_options import recomputes
from .norm import build_qk_norm


class SelfAttention(nn.Module):
    """[s(/TP with SP), b, h] -> same shape. Talks to the TP group `tp_group`, and with context
    parallelism its core to the CP group `cp_group` (None without).

    The fused QKV weight is laid out per query group, [q_1..q_k, k, v] for each group,
    so splitting its rows evenly over TP gives each rank whole groups. The attention core
    (scores, softmax, dropout, weighted sum) is CoreAttention (core_attention.py); with
    --recompute-granularity selective it alone is recomputed in the backward pass: it holds
    the s x s activations, yet costs few of the layer's FLOPs.

    --qk-layernorm normalises each head of q and k (--normalization over kv-channels, one weight shared by
    the heads) before RoPE, as Megatron-Core's q_layernorm / k_layernorm and HF Qwen3's q_norm / k_norm.
    """

    def __init__(self, config, tp_group, device=None, layer_number=1, cp_group=None):
        super().__init__()
        tp = comm.world(tp_group)
        self.layer_number = layer_number
        self.head_dim = config.kv_channels
        self.num_attention_heads_per_partition = config.num_attention_heads // tp
        self.num_query_groups_per_partition = config.num_query_groups // tp
        self.recompute_core = recomputes(config, "core_attn")  # --recompute-modules (default core_attn)
        self.rope_impl = rope_front.select(config.apply_rope_fusion, device or "cpu", config.params_dtype,
                                           force=config.fused_kernels)
        qkv_size = (config.num_attention_heads + 2 * config.num_query_groups) * config.kv_channels
        out_std = config.init_method_std / math.sqrt(2.0 * config.num_layers)
        fp8 = {"fp8": fp8_layer(config, layer_number), "cp_group": cp_group}
        self.linear_qkv = ColumnParallelLinear(
            config.hidden_size, qkv_size, group=tp_group, bias=config.add_bias_linear or config.add_qkv_bias,
            init_std=config.init_method_std, sequence_parallel=config.sequence_parallel,
            params_dtype=config.params_dtype, device=device, **fp8)
        per_group = config.num_attention_heads // config.num_query_groups * config.kv_channels
        set_qkv_split(self.linear_qkv.weight, (per_group, config.kv_channels, config.kv_channels))
        self.q_layernorm = self.k_layernorm = None
        if config.qk_layernorm:  # every rank normalises its own heads: the weights' grads are summed over TP
            self.q_layernorm, self.k_layernorm = (
                build_qk_norm(config, config.kv_channels, device, heads_split_over_tp=True) for _ in "qk")
        self.core_attention = CoreAttention(config, tp_group, layer_number, device, cp_group)
        self.linear_proj = RowParallelLinear(
            config.num_attention_heads * config.kv_channels, config.hidden_size, group=tp_group,
            bias=config.add_bias_linear, init_std=out_std, sequence_parallel=config.sequence_parallel,
            params_dtype=config.params_dtype, device=device, **fp8)

    def forward(self, x, rope=None, attn_mask=None, kv_cache=None):
        """x [s(/TP), b, h]; rope: (cos, sin) [s, 1, 1, d] for x's positions, or None;
        attn_mask: None = causal; kv_cache: a KVCache (kv_cache.py) for incremental decoding,
        causal attention only: x's tokens follow the cached ones."""
        qkv, _ = self.linear_qkv(x)
        s, b = qkv.shape[:2]
        heads, query_groups = self.num_attention_heads_per_partition, self.num_query_groups_per_partition
        per_group = heads // query_groups
        qkv = qkv.view(s, b, query_groups, per_group + 2, self.head_dim)
        # views by one split, whose backward concatenates the three gradients into qkv's in one pass:
        # indexing would give each its own zero-filled qkv-sized gradient, then two adds
        q, k, v = torch.split(qkv, [per_group, 1, 1], dim=3)
        q, k, v = q.reshape(s, b, heads, self.head_dim), k.squeeze(3), v.squeeze(3)
        if self.q_layernorm is not None:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        if rope is not None:
            q, k = (rope_front.apply_rope(t, *rope, impl=self.rope_impl) for t in (q, k))
        if kv_cache is not None:
            if attn_mask is not None:
                raise ValueError("the KV cache serves causal attention only (no attn_mask)")
            k, v = kv_cache.extend(self.layer_number, k, v)
            if k.shape[0] > s:  # earlier tokens cached: the causal mask is no longer square
                attn_mask = causal_mask_after(k.shape[0] - s, s, x.device)
        if self.recompute_core and self.training:
            out = checkpoint(self.core_attention, q, k, v, attn_mask)
        else:
            out = self.core_attention(q, k, v, attn_mask)
        return self.linear_proj(out)[0]
