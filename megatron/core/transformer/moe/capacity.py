"""Token dropping (--moe-expert-capacity-factor): each expert takes at most its capacity,
ceil(T x k / E x factor) of the micro-batch's T tokens; the rest of its (token, choice) pairs are
dropped. Which ones stay (--moe-token-drop-policy): probs keeps the highest routing probs (ties: the
earlier pair), position keeps the earliest pairs (rows in [s, b] order, s-major, over the whole
sequence; the k choices of a token in order).
The rule reads the whole micro-batch's routing. Where the ranks of a group each route part of it
(context parallelism, MoE parallel folding: the router's token group, token_share.py), they
all-gather the [T_local, k] probs, choices and row places, and each applies the rule to the whole
micro-batch and keeps its own rows, so capacity and drops are one process's in every layout.
"""
import math

import torch

from ... import comm
from .token_counts import tokens_per_expert


def capacity(num_tokens, topk, num_experts, factor):
    return math.ceil(num_tokens * topk / num_experts * factor)


def keep_over_capacity(probs, indices, num_experts, cap, policy="probs", rows=None):
    """probs, indices [N, k] (N tokens), rows [N]: each token's row in the micro-batch (None: 0..N-1)
    -> keep [N, k] bool: at most `cap` pairs per expert, chosen by `policy`. No communication."""
    N, k = indices.shape
    expert = indices.reshape(-1)
    # pairs in micro-batch order (the identity when rows is None)
    base = None
    if rows is not None:
        base = torch.argsort((rows[:, None] * k + torch.arange(k, device=rows.device)).reshape(-1))
    if policy == "probs":  # highest prob first, the earlier pair on ties
        p = -probs.detach().reshape(-1)
        priority = torch.argsort(p, stable=True) if base is None else base[torch.argsort(p[base], stable=True)]
    else:
        priority = torch.arange(expert.numel(), device=expert.device) if base is None else base
    order = priority[torch.argsort(expert[priority], stable=True)]  # by expert, then by priority
    per_expert = tokens_per_expert(expert, num_experts)
    starts = torch.cumsum(per_expert, 0) - per_expert
    rank_in_expert = torch.arange(order.numel(), device=order.device) - starts[expert[order]]
    keep = torch.zeros_like(expert, dtype=torch.bool)
    keep[order] = rank_in_expert < cap
    return keep.view(N, k)


def drop_over_capacity(probs, indices, num_experts, factor, policy="probs", group=None, rows=None):
    """probs, indices [T, k] -> the same with dropped pairs marked: index num_experts (no expert) and
    prob 0 (no gradient through it). group (None: this rank holds the whole micro-batch): the ranks
    routing the micro-batch's other tokens, rows [T] the places of this rank's tokens in it (s x b + b
    over the whole sequence); the routing is all-gathered over `group` (probs, choices, rows: detached)."""
    T, k = indices.shape
    size = comm.world(group) if group is not None else 1
    cap = capacity(T * size, k, num_experts, factor)
    if size == 1:
        keep = keep_over_capacity(probs, indices, num_experts, cap, policy, rows)
    else:
        every = [comm.all_gather_dim0(t, group) for t in (probs.detach(), indices, rows)]
        keep = keep_over_capacity(*every[:2], num_experts, cap, policy, every[2])
        keep = keep.view(size, T, k)[comm.rank(group)]
    return probs * keep, torch.where(keep, indices, torch.full_like(indices, num_experts))


def padded_places(counts, rows, size):
    """--moe-pad-expert-input-to-capacity: [rows] int64, where each row of an input in groups (counts:
    token_counts.TokenCounts, `rows` in all) goes when each group is followed by zero rows up to `size`
    (its capacity from every EP rank), so that the experts see fixed shapes. Computed on the device."""
    group = counts.groups(rows)
    starts = counts.ends - counts.counts()
    return group * size + torch.arange(rows, device=group.device) - starts[group]


def places_by_micro_batch(by_source, micro_batches, size, cap, device):
    """padded_places for FP8 experts whose rows come from several micro-batches (expert parallelism, folding):
    each expert's `size` rows are one block of `cap` per micro-batch (in the order they first appear in
    `micro_batches`, each source rank's), holding that micro-batch's rows in source order and then its zero
    rows, as one process pads each micro-batch's expert input. by_source: per local expert, its rows from each
    source (host ints, in the input's order). A micro-batch never brings an expert more than `cap` rows (the
    drop rule is one process's); ValueError if it does."""
    slot = {m: i for i, m in enumerate(dict.fromkeys(micro_batches))}
    shift, lengths, start = [], [], 0
    for e, rows in enumerate(by_source):
        filled = dict.fromkeys(slot, 0)
        for k, m in zip(rows, micro_batches):
            shift.append(e * size + slot[m] * cap + filled[m] - start)
            lengths.append(k)
            filled[m] += k
            start += k
        if max(filled.values(), default=0) > cap:
            raise ValueError(f"a micro-batch brings expert {e} {max(filled.values())} rows, over its capacity {cap}")
    return torch.repeat_interleave(torch.tensor(shift, dtype=torch.int64), torch.tensor(lengths, dtype=torch.int64),
                                   output_size=start).to(device) + torch.arange(start, device=device)


def pad_to_capacity(x, places, groups, size):
    """x [N, h] -> [groups x size, h]: row i at places[i] (padded_places), zeros elsewhere. The zero
    rows' outputs are cut off again by unpad; they change no value or gradient."""
    return x.new_zeros(groups * size, x.shape[1]).index_copy(0, places, x)


def unpad(y, places):
    """The inverse of pad_to_capacity: [G x size, h] -> [N, h]."""
    return y[places]
