"""Pre-norm transformer layer: x + drop(attn(norm(x))), then x + drop(mlp(norm(x)))."""
import contextlib

import torch.nn.functional as F
from torch import nn

from ..tensor_parallel.random import get_rng_tracker
from .attention import SelfAttention
from .mlp import MLP
from .norm import build_norm


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
    """[s(/TP), b, h] -> same. layer_number counts from 1 over the whole model."""

    def __init__(self, config, tp_group, layer_number, device=None):
        super().__init__()
        self.config, self.layer_number = config, layer_number
        self.input_layernorm = build_norm(config, device)
        self.self_attention = SelfAttention(config, tp_group, device, layer_number)
        self.pre_mlp_layernorm = build_norm(config, device)
        self.mlp = MLP(config, tp_group, device)

    def forward(self, x, rope=None, attn_mask=None):
        c = self.config
        x = x + hidden_dropout(self.self_attention(self.input_layernorm(x), rope, attn_mask),
                               c.hidden_dropout, self.training, c.sequence_parallel)
        x = x + hidden_dropout(self.mlp(self.pre_mlp_layernorm(x)),
                               c.hidden_dropout, self.training, c.sequence_parallel)
        return x
