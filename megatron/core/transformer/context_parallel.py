"""Context parallelism: the sequence split over the CP group, and attention across it.

Layout: the sequence is cut into 2C equal chunks and CP rank i holds chunks i and 2C-1-i, in
that order (with a causal mask every rank then does the same attention work). Tokens, labels,
loss mask and position ids are sliced so (batch_on_this_cp_rank); a sequence whose length is not
a multiple of 2C (x TP with sequence parallelism) is padded at its end with masked tokens, which
a causal model never lets a real token see. Attention (--cp-comm-type, Megatron-LM's names):
  p2p         ring attention (ring_attention.py): K/V blocks go around the ring, overlapped;
  all_gather  K/V gathered over CP, local queries, a mask from the global positions;
  a2a         Ulysses: an all-to-all trades heads for sequence, full attention on 1/C of the
              heads, then back (heads per TP rank must divide by C).
Everything else in a layer is per token, so it runs on the local chunks unchanged; the layer's
parameters get gradients on every CP rank, which are summed over DP x CP with the data-parallel ones.
"""
import dataclasses

import torch
import torch.distributed as dist

from .. import comm
from ..fusions import attention as attention_front
from ..tensor_parallel.mappings import gather_from_sequence_parallel_region
from ..watchdog import waiting
from .ring_attention import ring_attention

COMM_TYPES = ("p2p", "all_gather", "a2a")


def chunk_ids(cp_rank: int, cp_size: int) -> tuple[int, int]:
    """The two chunks (of 2 x cp_size) CP rank cp_rank holds."""
    return cp_rank, 2 * cp_size - 1 - cp_rank


def local_positions(seq_len: int, cp_rank: int, cp_size: int, device=None) -> torch.Tensor:
    """Global positions [seq_len / cp_size] of this CP rank's tokens (seq_len a multiple of 2C)."""
    n = seq_len // (2 * cp_size)
    return torch.cat([torch.arange(c * n, (c + 1) * n, device=device) for c in chunk_ids(cp_rank, cp_size)])


def slice_sequence(x: torch.Tensor, dim: int, cp_rank: int, cp_size: int) -> torch.Tensor:
    """x with the full sequence on `dim` -> this CP rank's two chunks, concatenated on `dim`."""
    if x.shape[dim] % (2 * cp_size):
        raise ValueError(f"sequence length {x.shape[dim]} is not a multiple of 2 x CP ({2 * cp_size})")
    chunks = x.chunk(2 * cp_size, dim=dim)
    return torch.cat([chunks[c] for c in chunk_ids(cp_rank, cp_size)], dim=dim)


@dataclasses.dataclass(frozen=True)
class CPSlice:
    """Which part of each sequence this rank gets: CP rank, CP size, and the multiple the
    sequence is padded to (2 x CP, times TP so that sequence parallelism splits it evenly)."""
    rank: int
    size: int
    multiple: int


def cp_slice(groups) -> "CPSlice | None":
    """The CPSlice of this rank of the grid, or None without context parallelism."""
    if groups.cp_size == 1:
        return None
    return CPSlice(groups.cp_rank, groups.cp_size, groups.layout.sequence_multiple)


def batch_on_this_cp_rank(batch: dict, cp: CPSlice) -> dict:
    """A GPT batch (tokens, labels, loss_mask [b, s], optional position_ids [b, s]) -> this CP rank's
    tokens [b, s' / C] (s' = s padded to cp.multiple with loss-masked tokens at the end), with
    position_ids always given (the global positions; padding gets position 0). An explicit
    attention_mask (--reset-attention-mask) is refused: no CP attention takes one."""
    if "attention_mask" in batch:
        raise ValueError("--context-parallel-size > 1 does not take --reset-attention-mask (no attention mask "
                         "crosses context-parallel ranks); drop the flag or use --context-parallel-size 1")
    tokens = batch["tokens"]
    b, s = tokens.shape
    pad = -s % cp.multiple
    positions = batch.get("position_ids")
    if positions is None:
        positions = torch.arange(s, device=tokens.device).expand(b, s)
    out = {}
    for key, value in dict(batch, position_ids=positions).items():
        if pad:
            value = torch.cat([value, value.new_zeros(b, pad)], dim=1)
        out[key] = slice_sequence(value, 1, cp.rank, cp.size).contiguous()
    return out


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 of [C, ...]: part j goes to rank j; its own inverse."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)  # after contiguous(): empty_like keeps a permuted input's strides
        with waiting("all-to-all (context parallel)", group):
            dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad, ctx.group), None


def _gathered_positions(s_local, cp_size, device):
    """Global positions of a sequence gathered over CP in rank order: [C x s_local]."""
    return torch.cat([local_positions(s_local * cp_size, r, cp_size, device) for r in range(cp_size)])


def all_gather_attention(q, k, v, group, causal=True):
    """q [s, b, h, d], k / v [s, b, g, d] (this rank's chunks) -> [s, b, h x d]: K/V gathered over
    `group`, the local queries attend to the positions a causal (or full) mask allows."""
    cp, rank = comm.world(group), comm.rank(group)
    s = q.shape[0]
    # backward reduce-scatters: every rank's queries contribute to each K/V block's gradient
    kv = gather_from_sequence_parallel_region(torch.cat([k, v], dim=2), group)
    k, v = kv.split(k.shape[2], dim=2)
    mask = None
    if causal:
        q_pos = local_positions(s * cp, rank, cp, q.device)
        mask = q_pos[:, None] >= _gathered_positions(s, cp, q.device)[None, :]
    else:
        mask = torch.ones(s, s * cp, dtype=torch.bool, device=q.device)
    return attention_front.sdpa(q, k, v, mask, 0.0)


def a2a_attention(q, k, v, group, causal=True):
    """Ulysses: q [s, b, h, d], k / v [s, b, g, d] -> [s, b, h x d]. An all-to-all over `group` gives
    each rank the whole sequence for h / C heads; attention there; the inverse all-to-all."""
    cp = comm.world(group)
    s, b, h, d = q.shape
    if k.shape[2] % cp:  # too few K/V groups to split: give every head its own copy
        k, v = (t.repeat_interleave(h // k.shape[2], dim=2) for t in (k, v))
    order = torch.argsort(_gathered_positions(s, cp, q.device))

    def scatter_heads(t):  # [s, b, n, d] -> [C x s, b, n / C, d] in global sequence order
        n = t.shape[2]
        t = t.reshape(s, b, cp, n // cp, d).permute(2, 0, 1, 3, 4)
        return _AllToAll.apply(t, group).reshape(cp * s, b, n // cp, d)[order]

    out = attention_front.sdpa(*(scatter_heads(t) for t in (q, k, v)), None if causal else
                               torch.ones(s * cp, s * cp, dtype=torch.bool, device=q.device), 0.0)
    # rank order again, then each sequence part back to its rank and the heads home
    back = _AllToAll.apply(out[torch.argsort(order)].reshape(cp, s, b, h // cp, d), group)
    return back.permute(1, 2, 0, 3, 4).reshape(s, b, h * d)


def activation_bytes_per_layer(s, b, h, a, tp=1, sp=False, cp=1, element_bytes=2):
    """Saved-activation bytes of one layer on one rank with context parallelism (Korthikanti et al.'s
    count on this rank's s / C tokens): s/C b h (34/t with SP, else 10 + 24/t) x element_bytes / 2, and
    instead of the s x s score terms the fp32 log-sum-exp [b, a/t, s/C] the CP attention keeps."""
    s_local = s / cp
    per_token = 34 / tp if sp else 10 + 24 / tp
    return int(s_local * b * h * per_token * element_bytes / 2 + 4 * b * (a / tp) * s_local)


def context_parallel_attention(q, k, v, group, comm_type, scale, causal=True):
    """q [s, b, h, d], k / v [s, b, g, d] holding this CP rank's chunks -> [s, b, h x d], exact
    attention over the whole sequence. Talks to the CP group `group` (see the module docstring)."""
    if comm_type == "p2p":
        to_bhsd = [t.permute(1, 2, 0, 3) for t in (q, k, v)]
        out = ring_attention(*to_bhsd, group, scale, causal)
        return out.permute(2, 0, 1, 3).reshape(q.shape[0], q.shape[1], -1)
    if comm_type == "all_gather":
        return all_gather_attention(q, k, v, group, causal)
    if comm_type == "a2a":
        return a2a_attention(q, k, v, group, causal)
    raise ValueError(f"--cp-comm-type {comm_type!r}: use one of {', '.join(COMM_TYPES)}")
