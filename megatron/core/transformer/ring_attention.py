"""Ring attention (--cp-comm-type p2p): K/V blocks travel around the context-parallel ring.

Each CP rank holds two chunks of the sequence, i and 2C-1-i of 2C (load balancing: with a
causal mask every rank then does the same work). At ring step j rank r holds the K/V of rank
src = r - j; what its queries may see of that block:
    causal, src == r:  both local chunks, lower-triangular mask (their global order is local order)
    causal, src <  r:  all local queries against src's first chunk, no mask (the second is later)
    causal, src >  r:  the local second chunk against both of src's chunks, no mask
    full mask:         everything against everything.
Each block runs a kernel that returns its rows' log-sum-exp (ring_kernels.py: flash, cuDNN or the
efficient one on CUDA, torch's flash kernel on CPU); partial outputs are merged with it, so only
q, k, v, out and lse are kept for backward (as flash attention: no s x s probabilities). The next
K/V block is sent and received while the current one is computed. The backward walks the ring the
other way: K/V go to r - 1 with the gradient accumulated for them so far (that hop overlapped with
the next block's compute), and after C hops each dK/dV is home.

With packed documents (cp_documents.py) each block is classified from the segment ids: a block no
query may see is skipped (forward and backward), one seen whole or causally by one document takes
the kernel as above, any other block its bool mask through the explicit kernel.
"""
import torch
import torch.distributed as dist

from ..watchdog import waiting
from .cp_documents import CAUSAL, MASKED, SKIP
from .ring_kernels import BlockKernel, acc, choose_kernel, usable_kernels


class _Ring:
    """Send to one neighbour and receive from the other on a CP group, asynchronously."""

    def __init__(self, group):
        self.group = group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def peer(self, offset):
        return dist.get_global_rank(self.group, (self.rank + offset) % self.size)

    def start(self, tensor, forward=True, tag=0):
        """Post send(tensor) to the next rank (the previous when not forward) and a receive from the
        other side; returns (handles, receive buffer). Transfers in flight together need distinct tags."""
        buf = torch.empty_like(tensor)
        to, frm = (self.peer(1), self.peer(-1)) if forward else (self.peer(-1), self.peer(1))
        ops = [dist.P2POp(dist.isend, tensor, to, self.group, tag), dist.P2POp(dist.irecv, buf, frm, self.group, tag)]
        return dist.batch_isend_irecv(ops), buf

    def finish(self, pending):
        handles, buf = pending
        with waiting("ring attention send/recv", self.group):
            for h in handles:
                h.wait()
        return buf


def merge(out, lse, block_out, block_lse):
    """Combine two softmax-normalised partials of the same rows by their log-sum-exp."""
    new = torch.logaddexp(lse, block_lse)
    return out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(block_lse - new).unsqueeze(-1), new


def _plan(rank, src, causal, sq, sk):
    """(query rows, key rows, causal mask) rank computes against src's K/V block (see the docstring)."""
    if not causal:
        return slice(0, sq), slice(0, sk), False
    if src == rank:
        return slice(0, sq), slice(0, sk), True
    if src < rank:
        return slice(0, sq), slice(0, sk // 2), False
    return slice(sq // 2, sq), slice(0, sk), False


def _block(rank, src, causal, sq, sk, documents):
    """(query rows, key rows, mask: False / True (causal) / a bool tensor) of the block, or None to skip."""
    rows, cols, mask = _plan(rank, src, causal, sq, sk)
    if documents is None:
        return rows, cols, mask
    kind, block_mask = documents.classify(rank, src, rows, cols, mask)
    if kind == SKIP:
        return None
    return rows, cols, block_mask if kind == MASKED else kind == CAUSAL


class RingAttention(torch.autograd.Function):
    """q [b, h, s, d], k / v [b, g, s, d] (this rank's two chunks) -> out [b, h, s, d]. Talks to `group`.
    kernel: the blocks' kernel (ring_kernels.KERNELS; None: ring_kernels.choose_kernel's). documents:
    a cp_documents.CPDocuments (causal within each packed document) or None."""

    @staticmethod
    def forward(ctx, q, k, v, group, scale, causal, kernel=None, documents=None, sink=None):
        ring = _Ring(group)
        blocks = BlockKernel(kernel or choose_kernel(q.device.type, q.dtype, q.shape[-1], usable_kernels(q.device)))
        kv = torch.stack([k, v]).contiguous()
        sq, sk = q.shape[2], k.shape[2]
        out = lse = None
        for step in range(ring.size):
            pending = ring.start(kv) if step < ring.size - 1 else None
            block = _block(ring.rank, (ring.rank - step) % ring.size, causal, sq, sk, documents)
            if block is None:  # no query here sees these keys (step 0, its own block, is never skipped)
                if pending is not None:
                    kv = ring.finish(pending)
                continue
            rows, cols, mask = block
            o, s = blocks.forward(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], scale, mask)
            if out is None:  # step 0 covers every row (its own block)
                out, lse = o, s
            else:
                out[:, :, rows], lse[:, :, rows] = merge(out[:, :, rows], lse[:, :, rows], o, s)
            if pending is not None:
                kv = ring.finish(pending)
        if sink is not None:
            # an attention sink adds exp(sink) to every row's denominator: rescale the merged rows once and
            # keep the larger log-sum-exp, which is all the unchanged backward needs (the sink has no value)
            with_sink = torch.logaddexp(lse, torch.full_like(lse, sink))
            out, lse = out * torch.exp(lse - with_sink).unsqueeze(-1), with_sink
        # stored as [s, b, h, d]: the caller's [s, b, h x d] view of it is then the same storage,
        # so linear_proj's saved input costs nothing on top of what is kept here
        b, h, _, d = out.shape
        out = torch.empty((sq, b, h, d), dtype=q.dtype, device=q.device).permute(1, 2, 0, 3).copy_(out)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.causal, ctx.blocks, ctx.documents = group, scale, causal, blocks, documents
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        dout = acc(dout)
        sq, sk = q.shape[2], k.shape[2]
        dq = torch.zeros_like(dout)
        kv = torch.stack([k, v]).contiguous()
        carried = None  # the dK/dV earlier ranks accumulated for the block held now, in flight
        for step in range(ring.size):
            src = (ring.rank + step) % ring.size  # the backward ring turns the other way
            pending = ring.start(kv, forward=False) if step < ring.size - 1 else None
            block = _block(ring.rank, src, ctx.causal, sq, sk, ctx.documents)
            dkv = torch.zeros(kv.shape, dtype=dout.dtype, device=q.device)
            if block is not None:
                rows, cols, mask = block
                g = ctx.blocks.backward(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], out[:, :, rows],
                                        dout[:, :, rows], lse[:, :, rows], ctx.scale, mask)
                dq[:, :, rows] += g[0]
                dkv[0][:, :, cols] += g[1]
                dkv[1][:, :, cols] += g[2]
            if carried is not None:  # received while this block was computed
                dkv += ring.finish(carried)
            # the block's gradient so far follows it to the previous rank (after the last step that
            # rank is the block's owner); it travels while the next block is computed
            carried = ring.start(dkv, forward=False, tag=1)
            if pending is not None:
                kv = ring.finish(pending)
        dkv = ring.finish(carried)
        dk, dv = dkv.to(k.dtype).unbind(0)
        return dq.to(q.dtype), dk, dv, None, None, None, None, None, None


def ring_attention(q, k, v, group, scale, causal=True, kernel=None, documents=None, sink=None):
    """q [b, h, s, d], k / v [b, g, s, d] holding chunks (i, 2C-1-i) of the sequence on CP rank i of
    `group` -> out [b, h, s, d]; exact attention over the whole sequence (causal or full, or causal within
    each of `documents`, a cp_documents.CPDocuments). kernel: the blocks' attention kernel (ring_kernels.py;
    None: the one chosen for q's device, dtype and head dim). sink: an attention-sink logit (--softmax-type
    off-by-one: 0.0) or None."""
    return RingAttention.apply(q, k, v, group, scale, causal, kernel, documents, sink)
