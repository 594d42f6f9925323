"""Buffers for the strategies that shard the gradients (optim_grads, ZeRO-2) and the
parameters too (optim_grads_params, ZeRO-3).

What one DP rank holds, and when (d DP ranks, N this rank's parameter elements with the
padding of every bucket to a multiple of d; a buffer of MoE experts' parameters is sharded over
the expert-data-parallel group instead, d its size):

- always: `grad_shard`, N/d elements of the gradient dtype: this rank's slice of every bucket's
  reduced gradient, written when the bucket's reduce-scatter completes, read by the optimizer.
  ZeRO-2 keeps the parameters whole (N, one tensor per bucket, gathered after each step as
  ZeRO-1 does); ZeRO-3 keeps only `param_shard`, N/d elements of the parameter dtype.
- during backward only: a bucket's full-size gradient tensor exists from the first gradient of the
  step that lands in it until its reduce-scatter has completed, then its storage is released
  (resized to 0; the parameters' main-grad views come back when it is allocated again). Without
  accumulation and with --overlap-grad-reduce at most two buckets' are alive at once; with
  gradient accumulation a bucket's lives across all microbatches of the step, since it is
  reduced once, after the last one.
- ZeRO-3 only (but for a group of one rank, whose bucket is its shard): a bucket's full-size
  parameter tensor exists from its all-gather (before the
  forward of its unit, and again before its backward) until that forward has returned or that
  backward has produced every gradient of the bucket (zero3.py). Until the first training step it
  holds the initial (or loaded) values, from which the shards are taken then.
"""
import torch

from .. import comm
from .param_and_grad_buffer import BucketLayout, bucket_layout

_NO_LIMIT = 1 << 62


def release(t):
    """Free t's storage; views of it stay valid objects and see the storage once it is back."""
    t.untyped_storage().resize_(0)


def is_allocated(t) -> bool:
    return t.untyped_storage().size() > 0


def allocate(t) -> bool:
    """Give t (released) its storage back, values undefined; -> whether it was released."""
    if is_allocated(t):
        return False
    t.untyped_storage().resize_(t.numel() * t.element_size())
    return True


def unit_layout(units_numels, dp_size):
    """One bucket per unit (ZeRO-3 gathers and reduces per unit), each padded to a multiple of
    dp_size. units_numels: per unit, its parameters' sizes in layout order. Pure function,
    shared with the memory estimator (buffers.buffer_layout). Returns (offsets, buckets, total) as bucket_layout."""
    offsets, buckets, base, first = [], [], 0, 0
    for numels in units_numels:
        offs, lays, total = bucket_layout(numels, _NO_LIMIT, dp_size, True)
        offsets += [base + o for o in offs]
        buckets += [BucketLayout(base + b.start, base + b.end, [first + i for i in b.params]) for b in lays]
        base, first = base + total, first + len(numels)
    return offsets, buckets, base


class ShardedBucket:
    """One bucket: full-size gradient (and ZeRO-3 parameter) tensors that come and go, views of
    the persistent shards, and its in-flight collectives."""

    def __init__(self, layout, params, grad_dtype, dp_group, grad_shard, param_shard, shard_base):
        self.params, self.group = params, dp_group
        self.start, self.end = layout.start, layout.end
        n, device = self.end - self.start, params[0].device
        self.k = n // comm.world(dp_group)
        self.grad = torch.zeros(n, dtype=grad_dtype, device=device)  # released once the views exist
        self.grad_shard = grad_shard[shard_base:shard_base + self.k]
        self.param_shard = param_shard[shard_base:shard_base + self.k] if param_shard is not None else None
        # ZeRO-3 over a group of one rank (MoE experts at EP = DP x CP): the shard is the whole bucket and
        # the parameters live in it, never gathered nor released
        self.whole = self.param_shard is not None and comm.world(dp_group) == 1
        self.param = self.param_shard if self.whole else torch.zeros(n, dtype=params[0].dtype, device=device)
        self.grad_handle = self.param_handle = None
        self.pending = set()

    def shard(self):
        """[lo, hi) buffer offsets of this DP rank's slice."""
        lo = self.start + comm.rank(self.group) * self.k
        return lo, lo + self.k

    def own(self, t):
        r = comm.rank(self.group)
        return t[r * self.k:(r + 1) * self.k]

    def ensure_grad(self):
        """Allocate and zero the full-size gradient tensor if it is released."""
        if allocate(self.grad):
            self.grad.zero_()

    def start_reduce(self, tag):
        self.ensure_grad()
        self.grad_handle = comm.reduce_scatter_inplace_async(self.grad, self.group, tag=tag)

    def finish_reduce(self):
        """Wait for the reduce-scatter, keep this rank's slice in grad_shard, release the rest
        (nothing to do when that was done already)."""
        if self.grad_handle is None and not is_allocated(self.grad):
            return
        if self.grad_handle is not None:
            self.grad_handle.wait()
            self.grad_handle = None
        self.grad_shard.copy_(self.own(self.grad))
        release(self.grad)


class ShardedBuffer:
    """Buckets of the parameters of one dtype in `layouts` (bucket_layout or unit_layout over
    `params`, in that order), with persistent gradient (and, shard_params, parameter) shards.

    Each parameter's main grad (main_grad(param)) is a view of its bucket's full gradient tensor; its `.data`
    becomes a view of its bucket's full parameter tensor. Talks to dp_group (buckets' collectives).
    """

    def __init__(self, params, grad_dtype, dp_group, offsets, layouts, shard_params):
        self.params, self.shard_params = params, shard_params
        dp = comm.world(dp_group)
        total = layouts[-1].end if layouts else 0
        device = params[0].device
        self.grad_shard = torch.zeros(total // dp, dtype=grad_dtype, device=device)
        self.param_shard = torch.zeros(total // dp, dtype=params[0].dtype, device=device) if shard_params else None
        self.offsets = dict(zip(map(id, params), offsets))
        self.main_grads = {}
        self.buckets, base = [], 0
        for lay in layouts:
            b = ShardedBucket(lay, [params[i] for i in lay.params], grad_dtype, dp_group, self.grad_shard,
                              self.param_shard, base)
            base += b.k
            for i in lay.params:
                p, off, n = params[i], offsets[i] - lay.start, params[i].numel()
                self.main_grads[id(p)] = b.grad[off:off + n].view_as(p)
                b.param[off:off + n].copy_(p.data.view(-1))
                p.data = b.param[off:off + n].view_as(p)
            if shard_params and not b.whole:
                b.param_shard.copy_(b.own(b.param))
            release(b.grad)
            self.buckets.append(b)
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.total = total

    def offset(self, param):
        return self.offsets[id(param)]

    def main_grad(self, param):
        return self.main_grads[id(param)]

    def numel(self):
        return self.total

    def zero_grad(self):
        """Nothing to zero: full gradient tensors are allocated zeroed by their first gradient."""

    def _shard_index(self, param, lo, hi):
        b = self._bucket_of[id(param)]
        shard_lo, shard_hi = b.shard()
        g = self.offset(param) + lo
        if not (shard_lo <= g and g + (hi - lo) <= shard_hi):
            raise ValueError(f"range [{lo}, {hi}) of a {list(param.shape)} parameter is not in this rank's shard")
        return b, g - shard_lo

    def grad_view(self, param, lo, hi):
        """The reduced gradient of param's flat [lo, hi), a range inside this rank's shard."""
        b, i = self._shard_index(param, lo, hi)
        return b.grad_shard[i:i + hi - lo]

    def param_view(self, param, lo, hi):
        """Where param's flat [lo, hi) persists on this rank (the shard with ZeRO-3)."""
        if not self.shard_params:
            return param.detach().view(-1)[lo:hi]
        b, i = self._shard_index(param, lo, hi)
        return b.param_shard[i:i + hi - lo]

    def memory_bytes(self):
        """(parameter, gradient) bytes held across the step: whole or sharded parameters, gradient shard."""
        grads = self.grad_shard.numel() * self.grad_shard.element_size()
        if self.shard_params:
            return self.param_shard.numel() * self.param_shard.element_size(), grads
        return sum(b.param.numel() * b.param.element_size() for b in self.buckets), grads
