"""Ring attention (ring_attention.RingAttention's own forward and backward) for C context-parallel
ranks in one process: a thread per rank, the ring's sends and receives through queues.

For a device one process cannot give a process group per rank: on one GPU NCCL refuses two ranks
and gloo sends host memory only. Everything but the transport is the real ring: the K/V blocks
in flight, the plan of each step, the blocks' kernel, the log-sum-exp merge, the dK/dV that travel
back. The backward is called directly, not through autograd (whose one device thread per GPU
would run every rank's backward in turn, and the first one to wait for a peer would hang).
"""
import queue
import threading
from unittest import mock

import torch

from megatron.core.transformer import ring_attention
from megatron.core.transformer.context_parallel import chunk_ids, slice_sequence

TIMEOUT = 120.0


class _QueueRing:
    """ring_attention._Ring's interface over queues: (destination, source, tag) -> messages in order."""

    def __init__(self, boxes, rank, size):
        self.boxes, self.rank, self.size = boxes, rank, size

    def start(self, tensor, forward=True, tag=0):
        to, frm = ((self.rank + 1) % self.size, (self.rank - 1) % self.size)
        if not forward:
            to, frm = frm, to
        self.boxes[(to, self.rank, tag)].put(tensor.clone())  # sent as it is now, as a real send
        return frm, tag

    def finish(self, pending):
        frm, tag = pending
        return self.boxes[(self.rank, frm, tag)].get(timeout=TIMEOUT)


class _Ctx:
    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def _whole(parts, cp, dim=2):
    """Each rank's two chunks (concatenated on dim) -> the whole sequence in order (slice_sequence's inverse)."""
    chunks = [None] * (2 * cp)
    for rank, part in enumerate(parts):
        for c, piece in zip(chunk_ids(rank, cp), part.chunk(2, dim=dim)):
            chunks[c] = piece
    return torch.cat(chunks, dim=dim)


def run_ring(q, k, v, dout, cp, scale, causal, kernel=None):
    """q [b, h, S, d], k / v [b, g, S, d], dout [b, h, S, d] over whole sequences (S a multiple of 2 cp)
    -> (out, dq, dk, dv) over the whole sequences, from cp ranks each holding its chunks."""
    boxes = {(r, (r + step) % cp, tag): queue.Queue() for r in range(cp) for step in (1, -1) for tag in (0, 1)}
    results, errors = [None] * cp, []

    def rank(r):
        try:
            mine = [slice_sequence(t, 2, r, cp).contiguous() for t in (q, k, v, dout)]
            ctx = _Ctx()
            with torch.no_grad():
                out = ring_attention.RingAttention.forward(ctx, *mine[:3], _QueueRing(boxes, r, cp), scale, causal,
                                                           kernel)
                results[r] = (out,) + ring_attention.RingAttention.backward(ctx, mine[3])[:3]
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    with mock.patch.object(ring_attention, "_Ring", lambda ring: ring):
        threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(cp)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    if errors:
        raise errors[0]
    assert all(r is not None for r in results), "a ring rank did not finish"
    return tuple(_whole([res[i] for res in results], cp) for i in range(4))
