"""Multi-latent attention (DeepSeek-V2 / V3; Megatron-Core's MultiLatentAttention), heads split over TP.

    q  = up_q(norm_q(down_q(x)))        (or proj_q(x) without query compression, --q-lora-rank none)
    c, k_rope = down_kv(x)              the latent [kv_lora_rank] and one rotary key [qk_pos_emb_head_dim]
    k_nope, v = up_kv(norm_kv(c))       per head
    k = [k_nope, rope(k_rope)]          the rotary key shared by every head
    q = [q_nope, rope(q_rope)]

The down-projections and latent norms are replicated over TP (small: rank x hidden). With sequence
parallelism they run on this rank's sequence shard, so their gradients are partial and marked
sequence_parallel (ParamMeta: finalize_model_grads sums them over TP, as the layer norms'); the
up-projections are column-parallel linears that gather the latent (kv_lora_rank wide, not hidden) over
the sequence. The rotary key is gathered the same way; without SP it is replicated and its gradient,
which every TP rank's heads add to, is summed over TP (copy_to_tensor_model_parallel_region).

The attention core is CoreAttention at head size max(q head, v head): the shorter of q / k and v is
zero-padded (zeros add nothing to scores or outputs) and q carries the softmax scale's YaRN factor.
Generation caches the normed latent and the rotated shared key per token (kv_lora_rank + qk_pos_emb_head_dim
numbers, not heads x (q head + v head)) and up-projects the cached latents at every step.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import comm
from ..fusions import rope as rope_front
from ..parallel_layout import sequence_split
from ..tensor_parallel import wgrad_fusion
from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from ..tensor_parallel.mappings import copy_to_tensor_model_parallel_region, gather_from_sequence_parallel_region
from ..tensor_parallel.param_meta import set_init, set_sequence_parallel
from ..tensor_parallel.random import checkpoint
from .core_attention import CoreAttention
from .kv_cache import causal_mask_after
from .mla_rope import deinterleave, softmax_scale
from .model_options import recomputes
from .norm import build_qk_norm


class ReplicatedLinear(nn.Module):
    """y = x W^T with W [out, in] whole on every TP rank; sequence_parallel: x is a sequence shard."""

    def __init__(self, input_size, output_size, init_std, sequence_parallel, params_dtype, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=params_dtype, device=device))
        set_init(self.weight, "normal", init_std)
        set_sequence_parallel(self.weight, sequence_parallel)

    def forward(self, x):
        return wgrad_fusion.linear_or_fused(x, self.weight)  # the gradient to DDP's grad sink where it has one


def _latent_norm(config, size, device):
    return build_qk_norm(config, size, device) if config.qk_layernorm else None  # replicated latents: SP's rule


class MultiLatentAttention(nn.Module):
    """[s(/TP with SP), b, h] -> same. Talks to the TP group `tp_group` and, with context parallelism,
    its core to `cp_group`. The same constructor and forward as SelfAttention (attention.py)."""

    def __init__(self, config, tp_group, device=None, layer_number=1, cp_group=None):
        super().__init__()
        c = self.config = config
        self.tp_group, self.layer_number = tp_group, layer_number
        self.heads = c.num_attention_heads // comm.world(tp_group)
        self.recompute_core, self.recompute_up = recomputes(c, "core_attn"), recomputes(c, "mla_up_proj")
        self.rope_impl = rope_front.select(c.apply_rope_fusion, device or "cpu", c.params_dtype,
                                           force=c.fused_kernels)
        std, sp, dtype, n = c.init_method_std, c.sequence_parallel, c.params_dtype, c.num_attention_heads

        def column(inp, out):
            return ColumnParallelLinear(inp, out, group=tp_group, bias=False, init_std=std, sequence_parallel=sp,
                                        params_dtype=dtype, device=device)
        if c.q_lora_rank is None:
            self.linear_q_proj = column(c.hidden_size, n * c.q_head_dim)
        else:
            self.linear_q_down_proj = ReplicatedLinear(c.hidden_size, c.q_lora_rank, std, sp, dtype, device)
            self.q_layernorm = _latent_norm(c, c.q_lora_rank, device)
            self.linear_q_up_proj = column(c.q_lora_rank, n * c.q_head_dim)
        self.linear_kv_down_proj = ReplicatedLinear(c.hidden_size, c.kv_lora_rank + c.qk_pos_emb_head_dim, std, sp,
                                                    dtype, device)
        self.kv_layernorm = _latent_norm(c, c.kv_lora_rank, device)
        self.linear_kv_up_proj = column(c.kv_lora_rank, n * (c.qk_head_dim + c.v_head_dim))
        self.head_dim = max(c.q_head_dim, c.v_head_dim)
        self.core_attention = CoreAttention(c, tp_group, layer_number, device, cp_group, head_dim=self.head_dim)
        # the core scales by 1 / sqrt(head_dim); q carries the rest of Megatron-Core's softmax scale
        self.q_factor = softmax_scale(c) * math.sqrt(self.head_dim)
        self.linear_proj = RowParallelLinear(
            n * c.v_head_dim, c.hidden_size, group=tp_group, bias=False, init_std=std / math.sqrt(2.0 * c.num_layers),
            sequence_parallel=sp, params_dtype=dtype, device=device)

    def _q_input(self, x):
        """What the query up-projection (or the one query projection) reads: the normed query latent, or x."""
        if self.config.q_lora_rank is None:
            return x
        latent = self.linear_q_down_proj(x)
        return self.q_layernorm(latent) if self.q_layernorm is not None else latent

    def _q_up(self, q_input, rope):
        """-> q [s, b, heads, q head] with its rotary part rotated."""
        c = self.config
        q = (self.linear_q_proj if c.q_lora_rank is None else self.linear_q_up_proj)(q_input)[0]
        s, b = q.shape[:2]
        q_nope, q_rope = q.view(s, b, self.heads, c.q_head_dim).split([c.qk_head_dim, c.qk_pos_emb_head_dim], -1)
        return torch.cat([q_nope, self._rope(q_rope, rope)], dim=-1)

    def _rope(self, t, rope):
        return rope_front.apply_rope(deinterleave(t), *rope, impl=self.rope_impl)

    def latents(self, x, rope):
        """x [s(/TP), b, h] -> q [s, b, heads, q head] (this rank's heads, rotated), the normed KV latent
        [s(/TP), b, kv_lora_rank] and the rotated shared key [s, b, 1, qk_pos_emb_head_dim]: what a
        generation cache keeps (not the per-head keys and values)."""
        c = self.config
        q = self._up(self._q_up, self._q_input(x), rope)
        latent, k_rope = self.linear_kv_down_proj(x).split([c.kv_lora_rank, c.qk_pos_emb_head_dim], -1)
        if self.kv_layernorm is not None:
            latent = self.kv_layernorm(latent)
        if c.sequence_parallel:
            k_rope = gather_from_sequence_parallel_region(k_rope, self.tp_group)
        else:
            k_rope = copy_to_tensor_model_parallel_region(k_rope, self.tp_group)
        return q, latent, self._rope(k_rope.unsqueeze(2), rope)

    def _up(self, fn, *args):
        """fn(*args), recomputed in the backward pass with --recompute-modules mla_up_proj (the up-projections'
        outputs, heads x head size per token, are the layer's largest activations; their inputs are latents)."""
        return checkpoint(fn, *args) if self.recompute_up and self.training else fn(*args)

    def keys_values(self, latent, k_rope):
        """The latent [sk(/TP), b, r] and rotated shared key [sk, b, 1, d_r] -> k [sk, b, heads, q head],
        v [sk, b, heads, v head] (this rank's heads)."""
        c = self.config
        kv = self.linear_kv_up_proj(latent)[0]
        sk, b = kv.shape[:2]
        k_nope, v = kv.view(sk, b, self.heads, c.qk_head_dim + c.v_head_dim).split([c.qk_head_dim, c.v_head_dim], -1)
        return torch.cat([k_nope, k_rope.expand(sk, b, self.heads, c.qk_pos_emb_head_dim)], dim=-1), v

    def forward(self, x, rope=None, attn_mask=None, kv_cache=None):
        """As SelfAttention.forward; rope: the (cos, sin) of mla_rope.mla_cos_sin for x's positions. kv_cache:
        a KVCache holding, per layer, the normed latents and rotated shared keys of the tokens before x's."""
        q, latent, k_rope = self.latents(x, rope)
        if kv_cache is not None:
            if sequence_split(self.config.sequence_parallel, comm.world(self.tp_group)):
                raise ValueError("generation with multi-latent attention runs without --sequence-parallel")
            if attn_mask is not None:
                raise ValueError("the KV cache serves causal attention only (no attn_mask)")
            latent, k_rope = kv_cache.extend(self.layer_number, latent, k_rope)
            if latent.shape[0] > q.shape[0]:  # earlier tokens cached: the causal mask is no longer square
                attn_mask = causal_mask_after(latent.shape[0] - q.shape[0], q.shape[0], x.device)
        k, v = self._up(self.keys_values, latent, k_rope)
        s, b, d, dv = q.shape[0], q.shape[1], self.head_dim, v.shape[-1]
        if self.q_factor != 1.0:
            q = q * self.q_factor
        q, k, v = (F.pad(t, (0, d - t.shape[-1])) if t.shape[-1] < d else t for t in (q, k, v))
        if self.recompute_core and self.training:
            out = checkpoint(self.core_attention, q, k, v, attn_mask)
        else:
            out = self.core_attention(q, k, v, attn_mask)
        if dv < d:
            out = out.view(s, b, self.heads, d)[..., :dv].reshape(s, b, self.heads * dv)
        return self.linear_proj(out)[0]
