"""Token dropping (--moe-expert-capacity-factor): each expert takes at most its capacity,
ceil(T x k / E x factor) of the micro-batch's T tokens on this rank; the rest of its (token, choice)
pairs are dropped. Which ones stay (--moe-token-drop-policy): probs keeps the highest routing probs
(ties: the earlier token), position keeps the earliest tokens (rows in [s, b] order, s-major).
The rule reads only this micro-batch's routing, which is the same in every layout (the router sees
whole sequences), so a capacity run equals one process exactly as a dropless one does.
"""
import math

import torch


def capacity(num_tokens, topk, num_experts, factor):
    return math.ceil(num_tokens * topk / num_experts * factor)


def drop_over_capacity(probs, indices, num_experts, factor, policy="probs"):
    """probs, indices [T, k] -> the same with dropped pairs marked: index num_experts (no expert) and
    prob 0 (no gradient through it). No communication."""
    T, k = indices.shape
    cap = capacity(T, k, num_experts, factor)
    expert = indices.reshape(-1)
    if policy == "probs":  # highest prob first, the earlier pair on ties
        priority = torch.argsort(-probs.detach().reshape(-1), stable=True)
    else:
        priority = torch.arange(expert.numel(), device=expert.device)
    order = priority[torch.argsort(expert[priority], stable=True)]  # by expert, then by priority
    per_expert = torch.bincount(expert, minlength=num_experts)
    starts = torch.cumsum(per_expert, 0) - per_expert
    rank_in_expert = torch.arange(order.numel(), device=order.device) - starts[expert[order]]
    keep = torch.zeros_like(expert, dtype=torch.bool)
    keep[order] = rank_in_expert < cap
    keep = keep.view(T, k)
    return probs * keep, torch.where(keep, indices, torch.full_like(indices, num_experts))


def pad_to_capacity(x, counts, size):
    """--moe-pad-expert-input-to-capacity: x [N, h] in groups of counts[g] rows -> [G x size, h], each
    group followed by zero rows up to `size` (its capacity from every EP rank), so the experts see
    fixed shapes. The zero rows' outputs are cut off again by unpad; they change no value or gradient."""
    parts = []
    for chunk in x.split(counts):
        parts += [chunk, chunk.new_zeros(size - chunk.shape[0], x.shape[1])]
    return torch.cat(parts)


def unpad(y, counts, size):
    """The inverse of pad_to_capacity: [G x size, h] -> [N, h]."""
    return torch.cat([chunk[:n] for chunk, n in zip(y.split(size), counts)]) if counts else y
