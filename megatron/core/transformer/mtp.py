"""Multi-token prediction (DeepSeek-V3; Megatron-Core's MultiTokenPredictionBlock), on the last pipeline stage.

Module k (1..D) takes the previous depth's hidden state h (the decoder's normed output for k = 1) and the
embedding of the tokens k ahead, and predicts the token k + 1 ahead with the shared output head:

    h_k = final_norm(layer(eh_proj([enorm(embed(tokens shifted by k)), hnorm(h_{k-1})])))

The shifted tokens, labels and loss masks are made once per micro-batch by the collate (add_mtp_inputs: the
last k positions are masked), before any context-parallel split, so every rank holds its own part of them
and no shift crosses ranks. The losses are named loss terms ('mtp_1 loss' ...) of the loss contract; their
value is the cross entropy (logged as is) and their gradient is scaled by --mtp-loss-scaling-factor / D
(scale_gradient), as Megatron-Core's MTPLossAutoScaler does.
"""
import torch
from torch import nn

from ..tensor_parallel.layers import ColumnParallelLinear
from ..tensor_parallel.mappings import gather_from_tensor_model_parallel_region, scatter_to_sequence_parallel_region
from .layer import TransformerLayer
from .norm import build_norm


def term_name(k):
    return f"mtp_{k} loss"


def loss_declaration(config):
    """{term name: batch key of its mask} of the MTP losses ({} without MTP), for the loss contract."""
    return {term_name(k): f"mtp_{k}_loss_mask" for k in range(1, (config.mtp_num_layers or 0) + 1)}


def _shifted(x, k):
    """[b, s] -> x[:, k:] followed by k zeros."""
    return torch.cat([x[:, k:], x.new_zeros(x.shape[0], k)], dim=1)


def add_mtp_inputs(batch, depth):
    """A GPT batch (tokens, labels, loss_mask [b, s]) with, for k = 1..depth, mtp_k_tokens / mtp_k_labels /
    mtp_k_loss_mask: each shifted k positions to the left, the last k positions masked."""
    out = dict(batch)
    for k in range(1, depth + 1):
        out[f"mtp_{k}_tokens"] = _shifted(batch["tokens"], k)
        out[f"mtp_{k}_labels"] = _shifted(batch["labels"], k)
        out[f"mtp_{k}_loss_mask"] = _shifted(batch["loss_mask"], k)
    return out


def mtp_inputs(batch, config):
    """[(tokens_k, labels_k)] for k = 1..D from a batch add_mtp_inputs made, or None without MTP."""
    if not config.mtp_num_layers:
        return None
    return [(batch[f"mtp_{k}_tokens"], batch[f"mtp_{k}_labels"]) for k in range(1, config.mtp_num_layers + 1)]


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def loss_terms(losses, batch, config):
    """{term name: (per-token loss [b, s] whose gradient is scaled by the MTP weight, its mask)}."""
    weight = config.mtp_loss_scaling_factor / config.mtp_num_layers
    return {term_name(k): (_ScaleGradient.apply(loss, weight), batch[f"mtp_{k}_loss_mask"])
            for k, loss in enumerate(losses, start=1)}


class MTPLayer(nn.Module):
    """[s(/TP), b, h] hidden and embedding -> [s(/TP), b, h]. Its transformer layer is numbered
    num_layers + depth (an MoE layer where the last decoder layer is one: MoEConfig.is_moe_layer)."""

    def __init__(self, config, groups, depth, device=None):
        super().__init__()
        self.config, self.tp_group = config, groups.tp
        self.enorm, self.hnorm = build_norm(config, device), build_norm(config, device)
        self.eh_proj = ColumnParallelLinear(
            2 * config.hidden_size, config.hidden_size, group=groups.tp, bias=False, init_std=config.init_method_std,
            sequence_parallel=config.sequence_parallel, params_dtype=config.params_dtype, device=device)
        self.transformer_layer = TransformerLayer(config, groups, config.num_layers + depth, device)
        self.final_layernorm = build_norm(config, device)

    def forward(self, hidden, embedded, rope=None, attn_mask=None):
        x = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))[0]  # [s, b, h / TP]
        x = gather_from_tensor_model_parallel_region(x, self.tp_group)
        if self.config.sequence_parallel:
            x = scatter_to_sequence_parallel_region(x, self.tp_group)
        return self.final_layernorm(self.transformer_layer(x, rope, attn_mask))


class MTPBlock(nn.Module):
    """The D MTP modules (the checkpoint names mtp.layers.N as Megatron-Core's)."""

    def __init__(self, config, groups, device=None):
        super().__init__()
        self.layers = nn.ModuleList(MTPLayer(config, groups, k, device) for k in range(1, config.mtp_num_layers + 1))

    def forward(self, hidden, inputs, embed, head, rope=None, attn_mask=None):
        """hidden: the decoder's output; inputs: mtp_inputs(); embed(tokens) -> [s(/TP), b, h];
        head(hidden, labels) -> per-token loss [b, s]. -> [loss_k for k = 1..D]."""
        losses = []
        for layer, (tokens, labels) in zip(self.layers, inputs):
            hidden = layer(hidden, embed(tokens), rope, attn_mask)
            losses.append(head(hidden, labels))
        return losses
