"""Single-tensor collectives along dim 0, in one place.

torch 2.13 renames all_gather_into_tensor / reduce_scatter_tensor to *_single and warns
on the old names; torch 2.11 (the GPU machine) may lack the new ones. Everything that
gathers or scatters a whole tensor goes through here. Every wait here is armed with the
hang watchdog (megatron/core/watchdog.py): a peer that never comes ends this rank with one line.
"""
import torch
import torch.distributed as dist

from . import debug
from .watchdog import waiting

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class PlanGroup:
    """A stand-in for a process group of `size` ranks seen from rank `rank`, with no
    processes behind it: lets a model shard be built on the meta device for planning
    (ParallelLayout.plan_groups, the memory estimator). Any collective on it fails."""

    def __init__(self, size, rank=0):
        self.size, self.rank = size, rank


def world(group) -> int:
    return group.size if isinstance(group, PlanGroup) else dist.get_world_size(group)


def rank(group) -> int:
    return group.rank if isinstance(group, PlanGroup) else dist.get_rank(group)


def all_gather_dim0(x: torch.Tensor, group, tag=None) -> torch.Tensor:
    """[n, ...] on each rank -> [n * world, ...] concatenated in group-rank order (tag: counted, debug.py)."""
    size = world(group)
    if size == 1:
        return x
    x = x.contiguous()
    out = torch.empty((x.shape[0] * size,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    _count(tag, out.numel() * out.element_size(), size, 1)
    with waiting("all-gather", group):
        _all_gather(out, x, group=group)
    return out


def reduce_scatter_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """[n * world, ...] on each rank -> the sum over ranks of this rank's [n, ...] slice."""
    size = world(group)
    if size == 1:
        return x
    if x.shape[0] % size:
        raise ValueError(f"dim 0 ({x.shape[0]}) is not divisible by the group size {size}")
    x = x.contiguous()
    out = torch.empty((x.shape[0] // size,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    with waiting("reduce-scatter", group):
        _reduce_scatter(out, x, group=group)
    return out


def all_reduce_(x: torch.Tensor, group, tag=None) -> torch.Tensor:
    """Sum in place over the group; returns x (tag: counted, debug.py)."""
    if world(group) > 1:
        _count(tag, x.numel() * x.element_size(), world(group), 2)
        with waiting("all-reduce", group):
            dist.all_reduce(x, group=group)
    return x


def all_reduce_max_(x: torch.Tensor, group) -> torch.Tensor:
    """Elementwise MAX in place over the group (FP8 amaxes); returns x."""
    if world(group) > 1:
        with waiting("all-reduce", group):
            dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
    return x


# Bytes each rank sends, per tag, under the ring algorithm: all-reduce 2(n-1)/n of the
# buffer, reduce-scatter and all-gather (n-1)/n of the full buffer. Counted at every call
# made through the functions below, so tests can check the traffic against theory
# (debug.count_traffic).
def _count(tag, full_bytes, n, factor):
    if tag is not None:
        debug.record_traffic(tag, factor * (n - 1) * full_bytes / n)


class Watched:
    """An async collective's work handle whose wait() is armed with the hang watchdog."""

    __slots__ = ("work", "op", "group")

    def __init__(self, work, op, group):
        self.work, self.op, self.group = work, op, group

    def wait(self):
        with waiting(self.op, self.group):
            return self.work.wait()

    def is_completed(self):
        return self.work.is_completed()


def all_reduce_async(x, group, tag=None):
    """Sum x in place over `group`; returns the work handle (None for a group of one)."""
    n = world(group)
    if n == 1:
        return None
    _count(tag, x.numel() * x.element_size(), n, 2)
    return Watched(dist.all_reduce(x, group=group, async_op=True), f"all-reduce ({tag})", group)


def _own_slice(x, group):
    n = world(group)
    k = x.numel() // n
    r = rank(group)
    return x[r * k:(r + 1) * k]


def reduce_scatter_inplace_async(x, group, tag=None):
    """Sum the 1-D buffer x over `group` into this rank's slice x[r*k:(r+1)*k] (k = len/n).

    The other slices of x are left with stale partial sums. Returns the work handle.
    """
    n = world(group)
    if n == 1:
        return None
    _count(tag, x.numel() * x.element_size(), n, 1)
    return Watched(_reduce_scatter(_own_slice(x, group), x, group=group, async_op=True), f"reduce-scatter ({tag})",
                   group)


def all_gather_inplace_async(x, group, tag=None):
    """Fill the 1-D buffer x from every rank's slice x[r*k:(r+1)*k]; returns the work handle."""
    n = world(group)
    if n == 1:
        return None
    _count(tag, x.numel() * x.element_size(), n, 1)
    return Watched(_all_gather(x, _own_slice(x, group), group=group, async_op=True), f"all-gather ({tag})", group)


def all_to_all_uneven(x, send_sizes, recv_sizes, group, tag=None):
    """1-D x, cut into len(send_sizes) consecutive parts, part j to rank j; -> what every rank sent this
    one, in rank order (recv_sizes elements from each). Counts what leaves this rank (not its own part)."""
    if world(group) == 1:
        return x
    out = torch.empty(sum(recv_sizes), dtype=x.dtype, device=x.device)
    if tag is not None:
        debug.record_traffic(tag, (sum(send_sizes) - send_sizes[rank(group)]) * x.element_size())
    with waiting("all-to-all", group):
        dist.all_to_all_single(out, x.contiguous(), list(recv_sizes), list(send_sizes), group=group)
    return out
