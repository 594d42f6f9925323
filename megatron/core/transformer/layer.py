"""Transformer layer. Pre-norm: x + drop(attn(norm(x))), then x + drop(mlp(norm(x))).
Post-norm (--post-norm, BERT's): norm(x + drop(attn(x))), then norm(x + drop(mlp(x)))."""
import contextlib

import torch.nn.functional as F
from torch import nn

from ..tensor_parallel.random import checkpoint, get_rng_tracker
from .attention import SelfAttention
from .mla import MultiLatentAttention
from .model_options import recomputes
from .moe.moe_layer import build_mlp
from .norm import build_norm
from .norm_recompute import norm_then


def hidden_dropout(x, p, training, sequence_parallel):
    """Dropout on activations outside TP regions.

    Replicated activations use the default RNG (same mask on every TP rank, so they stay
    identical); sequence-parallel shards are different tokens, so they use the TP RNG.
    """
    if p == 0.0 or not training:
        return x
    ctx = get_rng_tracker().fork() if sequence_parallel else contextlib.nullcontext()
    with ctx:
        return F.dropout(x, p, training)


class TransformerLayer(nn.Module):
    """[s(/TP), b, h] -> same. layer_number counts from 1 over the whole model. groups: this rank's
    ProcessGroups (TP for the layers, CP for attention, the expert groups for an MoE layer)."""

    def __init__(self, config, groups, layer_number, device=None):
        super().__init__()
        self.config, self.layer_number = config, layer_number
        # the names say where each norm sits (checkpoints and HF conversion rely on them)
        first, second = ("post_attention_layernorm", "post_mlp_layernorm") if config.post_norm \
            else ("input_layernorm", "pre_mlp_layernorm")
        setattr(self, first, build_norm(config, device))
        attention = MultiLatentAttention if config.multi_latent_attention else SelfAttention
        self.self_attention = attention(config, groups.tp, device, layer_number, groups.cp)
        setattr(self, second, build_norm(config, device))
        self.mlp = build_mlp(config, groups, layer_number, device)
        self.norms = (getattr(self, first), getattr(self, second))
        # --recompute-modules mlp / moe: the feed-forward block recomputed in the backward pass
        self.recompute_mlp = recomputes(config, "moe" if config.is_moe_layer(layer_number) else "mlp")
        # --recompute-modules layernorm: the norms' outputs freed once read, rebuilt in the backward
        self.recompute_norms = recomputes(config, "layernorm")
        # what forward runs: the eager parts, or their torch.compile'd versions after compile_regions()
        self._whole, self._attention_part = self._forward, self._attention

    def compile_regions(self, compile_fn):
        """Run this layer's computation through compile_fn (torch.compile with its options;
        compiled_layers.py): the whole layer, or for an MoE layer the attention part only (the token
        dispatch and the experts stay eager). forward() itself stays eager, so hooks on this module
        (ZeRO-3's gathers) run outside the compiled region."""
        if self.config.is_moe_layer(self.layer_number):
            self._attention_part = compile_fn(self._attention)
        else:
            self._whole = compile_fn(self._forward)

    def _mlp(self, x):
        return checkpoint(self.mlp, x) if self.recompute_mlp and self.training else self.mlp(x)

    def _dropout(self, x):
        return hidden_dropout(x, self.config.hidden_dropout, self.training, self.config.sequence_parallel)

    def forward(self, x, rope=None, attn_mask=None, kv_cache=None):
        """kv_cache: None, or a KVCache for incremental decoding (attention.SelfAttention.forward)."""
        if kv_cache is not None:  # decoding: the eager path (a cache's in-place writes are no graph to keep)
            return self._forward(x, rope, attn_mask, kv_cache)
        return self._whole(x, rope, attn_mask)

    def _attention(self, x, rope, attn_mask, kv_cache=None):
        """-> (x + the attention block's output, the MLP's norm of it), pre-norm without norm recompute."""
        norm1, norm2 = self.norms
        # the residual add and the MLP's norm: one compiled kernel with --residual-norm-fusion (transformer/norm.py)
        return norm2.residual_then(self._dropout(self.self_attention(norm1(x), rope, attn_mask, kv_cache)), x)

    def _forward(self, x, rope=None, attn_mask=None, kv_cache=None):
        norm1, norm2 = self.norms
        if self.config.post_norm:
            x = norm1(x + self._dropout(self.self_attention(x, rope, attn_mask, kv_cache)))
            return norm2(x + self._dropout(self._mlp(x)))
        if self.recompute_norms and self.training:
            x = x + self._dropout(norm_then(norm1, x, self.self_attention, rope, attn_mask, kv_cache))
            return x + self._dropout(norm_then(norm2, x, self._mlp))
        x, y = (self._attention if kv_cache is not None else self._attention_part)(x, rope, attn_mask, kv_cache)
        return x + self._dropout(self._mlp(y))
