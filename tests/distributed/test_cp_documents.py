"""Context-parallel attention over packed documents on real processes, against dense attention over the
whole sequence with the documents' mask (fp64): forward and backward, GQA, ring (p2p), all_gather and a2a,
documents that cross chunk boundaries and documents shorter than a chunk; and the ring's skipped blocks."""
import math

import torch
import torch.distributed as dist

from megatron.core.transformer.context_parallel import context_parallel_attention, local_positions, slice_sequence
from megatron.core.transformer.cp_documents import ring_block_kinds
from megatron.core.transformer.documents import Documents
from megatron.core.transformer.ring_attention import _plan
from tests.harness import spawn


def _segments(s, b, seed):
    """[b, s] segment ids: sample 0 documents of lengths 1..s/2 (crossing chunk boundaries), sample 1 one
    document over the whole sequence."""
    gen = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < s:
        n = min(int(torch.randint(1, s // 2 + 1, (1,), generator=gen)), s - total)
        lengths.append(n)
        total += n
    first = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return torch.stack([first] + [torch.zeros(s, dtype=torch.long)] * (b - 1))


def _dense(q, k, v, segments, window=None, sink=None):
    """[s, b, h, d] -> [s, b, h x d]: softmax attention, causal within each document and the window, with
    the sink column, fp64."""
    h, g = q.shape[2], k.shape[2]
    k, v = (t.repeat_interleave(h // g, dim=2) for t in (k, v))
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(q.shape[-1])
    allowed = Documents(segments).dense_mask()
    if window is not None:
        i = torch.arange(q.shape[0])
        allowed = allowed & (i[:, None] - i[None, :] <= window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sink is not None:
        scores = torch.cat([scores, torch.full(scores.shape[:-1] + (1,), sink, dtype=scores.dtype)], dim=-1)
    probs = scores.softmax(-1)[..., :q.shape[0]]
    return torch.einsum("bhst,tbhd->sbhd", probs, v).reshape(q.shape[0], q.shape[1], -1)


def _compare(groups, cases):
    cp, rank = dist.get_world_size(), dist.get_rank()
    errors = {}
    for comm_type, heads, kv_groups, seed, *extra in cases:
        window, sink = extra if extra else (None, None)
        gen = torch.Generator().manual_seed(seed)
        s, b, d = 8 * cp, 2, 8
        segments = _segments(s, b, seed)
        q, k, v = (torch.randn(s, b, n, d, generator=gen, dtype=torch.float64) for n in (heads, kv_groups, kv_groups))
        dout = torch.randn(s, b, heads * d, generator=gen, dtype=torch.float64)
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = _dense(*full, segments, window, sink)
        ref.backward(dout)
        local = [slice_sequence(t, 0, rank, cp).clone().requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(*local, dist.group.WORLD, comm_type, 1 / math.sqrt(d),
                                         documents=Documents(segments), window=window, sink=sink)
        out.backward(slice_sequence(dout, 0, rank, cp))
        err = (out - slice_sequence(ref, 0, rank, cp)).abs().max().item()
        for t, f in zip(local, full):
            err = max(err, (t.grad - slice_sequence(f.grad, 0, rank, cp)).abs().max().item())
        errors[(comm_type, heads, kv_groups, seed, window, sink)] = err
    return errors


CASES = [(c, 4, g, seed) for c in ("p2p", "all_gather", "a2a") for g in (4, 2) for seed in (1, 2)]
# windows shorter (3) and longer (12) than a CP2 chunk of 8, with and without the off-by-one sink
WINDOW_CASES = [(c, 4, 2, 5, window, sink) for c in ("p2p", "all_gather", "a2a") for window in (3, 12, None)
                for sink in (None, 0.0) if (window, sink) != (None, None)]


def test_cp2_documents_match_dense_attention_forward_and_backward():
    for rank_errors in spawn(2, _compare, CASES):
        for case, err in rank_errors.items():
            assert err < 1e-10, f"{case}: max abs error {err}; all: {rank_errors}"


def test_cp2_windows_and_sinks_match_dense_attention():
    for rank_errors in spawn(2, _compare, WINDOW_CASES):
        for case, err in rank_errors.items():
            assert err < 1e-10, f"{case}: max abs error {err}; all: {rank_errors}"


def test_cp4_ring_documents_match_dense_attention():
    for rank_errors in spawn(4, _compare, [("p2p", 4, 2, 3), ("p2p", 4, 4, 4)]):
        for case, err in rank_errors.items():
            assert err < 1e-10, f"{case}: max abs error {err}; all: {rank_errors}"


def _kinds(segments, cp):
    s = segments.shape[1]
    positions = torch.stack([local_positions(s, r, cp) for r in range(cp)])
    return ring_block_kinds(segments, positions, lambda rank, src: _plan(rank, src, True, s // cp, s // cp))


def test_ring_skips_the_blocks_no_document_reaches():
    # CP4, chunks of 4: one document per chunk -> each rank's own (diagonal) block only, two documents in
    # it (chunks i and 7 - i), so masked; 12 of 16 skipped
    per_chunk = torch.arange(8).repeat_interleave(4)[None]
    assert _kinds(per_chunk, 4) == {"skip": 12, "full": 0, "causal": 0, "masked": 4}
    # one document over everything: nothing skipped, the plain causal ring
    assert _kinds(torch.zeros(1, 32, dtype=torch.long), 4) == {"skip": 0, "full": 12, "causal": 4, "masked": 0}
    # a document across the first two chunks: rank 1 needs rank 0's first chunk, masked to the document
    crossing = torch.tensor([[0] * 6 + list(range(1, 27))])
    kinds = _kinds(crossing, 4)
    assert kinds == {"skip": 11, "full": 0, "causal": 0, "masked": 5}, kinds
