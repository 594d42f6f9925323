"""Token dispatchers: bring each (token, choice) pair to its expert's rank and the outputs back.

Both take tokens [T, h] replicated over TP (each TP rank dispatches within its own EP group,
groups.ep, EP ranks holding consecutive blocks of experts) and give the local experts their
tokens sorted by local expert; combine() weighs each expert output by its routing prob and
sums the k choices of every token. Without EP both are a local permutation. Pairs with expert
index E (dropped over capacity) go nowhere and add nothing.
"""
import torch
import torch.distributed as dist

from ... import comm
from ...tensor_parallel.mappings import gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region
from ...watchdog import waiting
from .token_counts import TokenCounts


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, group, out_splits, in_splits):
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        with waiting("all-to-all (tokens)", group):
            dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        return _AllToAll.apply(g, ctx.group, ctx.in_splits, ctx.out_splits), None, None, None


def _sort_pairs(indices, first, count):
    """indices [T, k] -> (order: the pair indices (t k + j) sorted by expert, stably; ends [count + 1]:
    where the runs of experts first - 1 (before the local ones), first, ..., first + count - 1 end in
    `order`). Dropped pairs (index E) sort last."""
    expert, order = torch.sort(indices.reshape(-1), stable=True)
    bounds = torch.arange(first, first + count + 1, device=indices.device)
    return order, torch.searchsorted(expert, bounds)


class AllGatherDispatcher:
    """Every EP rank gathers all tokens and routing of its EP group, runs the pairs that chose its
    experts, and reduce-scatters the weighted outputs back (groups.ep). by_source: also count each
    local expert's rows per source rank (FP8 experts cast them apart; a few more ops per dispatch)."""

    def __init__(self, num_experts, first, count, ep_group, by_source=False):
        self.num_experts, self.first, self.count, self.group = num_experts, first, count, ep_group
        self.ep = comm.world(ep_group) if ep_group is not None else 1
        self.by_source = by_source and ep_group is not None

    def dispatch(self, x, probs, indices, dropless=False):
        """x [T, h], probs / indices [T, k] -> (tokens [N, h] sorted by local expert, TokenCounts).
        dropless (no capacity factor): every pair is kept, so with all experts here nothing is read
        on the host; else the local run's bounds are (one .tolist()), with by_source each expert's
        rows per source rank too (TokenCounts.by_source)."""
        k = indices.shape[1]
        if self.group is not None:
            x = gather_from_sequence_parallel_region(x, self.group)
            probs = gather_from_sequence_parallel_region(probs, self.group)
            indices = comm.all_gather_dim0(indices, self.group)
        order, ends = _sort_pairs(indices, self.first, self.count)
        if dropless and self.count == self.num_experts:
            counts = TokenCounts(ends[1:])
        else:
            tally = self._by_source(order, indices, k, x.shape[0]) if self.by_source else ends[:0]
            host = torch.cat([ends, tally]).tolist()  # the dispatch's one host read
            host, tally = host[:self.count + 1], host[self.count + 1:]
            by_source = [tally[e * self.ep:(e + 1) * self.ep] for e in range(self.count)] if tally else None
            order = order[host[0]:host[-1]]
            counts = TokenCounts(ends[1:] - ends[0], [b - a for a, b in zip(host[:-1], host[1:])], by_source)
        self.rows, self.weights, self.total = order // k, probs.reshape(-1)[order], x.shape[0]
        return x[self.rows], counts

    def _by_source(self, order, indices, k, total):
        """[count x EP] on the device: the pairs each source rank sends each local expert, (expert, source)
        order. The gathered tokens are in source order and the sort is stable, so within an expert's run
        the rows stand in that order: these are its consecutive pieces."""
        source = (order // k) // (total // self.ep)
        local = indices.reshape(-1)[order] - self.first
        mine = (local >= 0) & (local < self.count)
        slot = torch.where(mine, local * self.ep + source, torch.full_like(local, self.count * self.ep))
        return torch.zeros(self.count * self.ep + 1, dtype=torch.int64, device=order.device) \
            .scatter_add_(0, slot, torch.ones_like(slot))[:-1]

    def combine(self, y):
        """y [N, h] (dispatch's order) -> [T, h]: sum over choices of prob x expert output."""
        out = weighted_sum(y, self.rows, self.weights, self.total)
        return reduce_scatter_to_sequence_parallel_region(out, self.group) if self.group is not None else out


class AllToAllDispatcher:
    """Each rank sorts its pairs by expert, exchanges the per-expert counts over groups.ep, then
    the tokens themselves (all-to-all with those counts); combine() sends the outputs back.
    Host reads: none without EP when dropless; else one .tolist() per dispatch (the kept pairs, the
    all-to-all's splits); nothing in combine or in backward."""

    def __init__(self, num_experts, first, count, ep_group):
        self.num_experts, self.first, self.count, self.group = num_experts, first, count, ep_group
        self.ep = comm.world(ep_group) if ep_group is not None else 1

    def dispatch(self, x, probs, indices, dropless=False):
        k = indices.shape[1]
        expert, order = torch.sort(indices.reshape(-1), stable=True)
        # where each expert's run ends in `order` (dropped pairs, index E, sort after the last)
        ends = torch.searchsorted(expert, torch.arange(1, self.num_experts + 1, device=x.device), out_int32=True)
        if self.group is None:
            host = None if dropless else ends.tolist()
            if host is not None:  # dropped pairs are cut off
                order = order[:host[-1]]
            self._keep(order, probs, x, k)
            sizes = None if host is None else [b - a for a, b in zip([0] + host[:-1], host)]
            return x[self.rows], TokenCounts(ends, sizes)
        per_expert = torch.diff(ends, prepend=ends.new_zeros(1))  # [E]: the pairs this rank sends each expert
        # [source rank, local expert]: how many pairs each EP rank sends to each of my experts
        recv = torch.empty_like(per_expert)
        with waiting("all-to-all (token counts)", self.group):
            dist.all_to_all_single(recv, per_expert, group=self.group)
        host = torch.cat([per_expert, recv]).tolist()  # the dispatch's one host read
        mine, theirs = host[:self.num_experts], host[self.num_experts:]
        C = self.count
        self.send_splits = [sum(mine[r * C:(r + 1) * C]) for r in range(self.ep)]
        self.recv_splits = [sum(theirs[r * C:(r + 1) * C]) for r in range(self.ep)]
        self._keep(order[:sum(mine)], probs, x, k)
        received = _AllToAll.apply(x[self.rows], self.group, self.recv_splits, self.send_splits)
        # received is ordered (source rank, expert): a stable sort by expert regroups it as (expert, source rank)
        total = sum(self.recv_splits)
        expert_of_row = torch.repeat_interleave(torch.arange(self.ep * C, device=x.device) % C, recv,
                                                output_size=total)
        self.regroup = torch.sort(expert_of_row, stable=True).indices
        by_source = [[theirs[r * C + e] for r in range(self.ep)] for e in range(C)]  # (expert, source) order
        sizes = [sum(rows) for rows in by_source]
        return received[self.regroup], TokenCounts(torch.cumsum(recv.view(self.ep, C).sum(0), 0), sizes, by_source)

    def _keep(self, order, probs, x, k):
        self.rows, self.weights, self.total = order // k, probs.reshape(-1)[order], x.shape[0]

    def combine(self, y):
        if self.group is not None:
            back = torch.empty_like(y).index_copy(0, self.regroup, y) if y.shape[0] else y
            y = _AllToAll.apply(back, self.group, self.send_splits, self.recv_splits)
        return weighted_sum(y, self.rows, self.weights, self.total)


def weighted_sum(y, rows, weights, total):
    """[total, h] in y's dtype: row rows[i] += weights[i] x y[i], summed in the weights' dtype (the router's:
    --moe-router-dtype fp32 weighs and sums bf16 expert outputs in fp32, as Megatron-Core)."""
    out = y.new_zeros((total, y.shape[1]), dtype=weights.dtype).index_add(0, rows, y.to(weights.dtype)
                                                                         * weights.unsqueeze(1))
    return out.to(y.dtype)


def build_dispatcher(kind, num_experts, first, count, ep_group, by_source=False):
    """kind: 'allgather' or 'alltoall'; ep_group None without expert parallelism. by_source: the local experts'
    rows per source rank are wanted (TokenCounts.by_source; the all-to-all knows them anyway)."""
    if kind == "allgather":
        return AllGatherDispatcher(num_experts, first, count, ep_group, by_source)
    return AllToAllDispatcher(num_experts, first, count, ep_group)
