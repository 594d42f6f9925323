"""What FP8 changes in a layer's saved activations (the memory estimate, activations.py).

Per-tensor recipes keep each linear's input as its FP8 copy (1 byte an element) instead of the input
itself; the column-parallel linears (QKV, fc1) keep it gathered over the sequence with SP ([s, b, h], the
gather's FP8 bytes), where the plain layer keeps its shard. Blockwise keeps the inputs in their own
precision (the backward casts them along another dimension), gathered likewise. The weights are kept
as the parameters themselves, so FP8 adds no weight bytes per microbatch. As the paper's formula, the
attention projection's input is taken to be kept by the projection alone (the unfused core's layer).
"""
import torch


def fp8_layers(c) -> int:
    """How many of the model's layers run their linears in FP8 (--first-last-layers-bf16 keeps some out)."""
    if c.fp8_format is None:
        return 0
    if not c.first_last_layers_bf16:
        return c.num_layers
    return max(0, c.num_layers - c.num_layers_at_start_in_bf16 - c.num_layers_at_end_in_bf16)


def fp8_delta_bytes_per_layer(c, micro_batch, tp, sp):
    """Saved bytes an FP8 layer keeps beyond the same layer without FP8 (negative: fewer), per microbatch,
    on s / CP tokens."""
    s, b, h = c.seq_length / c.context_parallel_size, micro_batch, c.hidden_size
    act = 2 if c.params_dtype != torch.float32 else 4
    whole = s * b * h
    rep = whole / (tp if sp else 1)  # an activation outside the TP regions (the plain layer's shard)
    split = whole / tp               # inside them
    ffn = c.ffn_hidden_size / h      # linear_fc2's input (SwiGLU's product too)
    gathered = act * 2 * (whole - rep)  # QKV's and fc1's inputs kept whole with SP
    if c.fp8_recipe == "blockwise":
        return gathered
    return 2 * (whole - act * rep) + (1 - act) * split * (1 + ffn)


def fp8_delta_bytes(c, micro_batch, tp, sp):
    """fp8_delta_bytes_per_layer averaged over the model's layers (the ones in FP8 count)."""
    if c.fp8_format is None:
        return 0.0
    return fp8_delta_bytes_per_layer(c, micro_batch, tp, sp) * fp8_layers(c) / c.num_layers
