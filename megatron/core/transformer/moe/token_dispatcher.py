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


class AllGatherDispatcher:
    """Every EP rank gathers all tokens and routing of its EP group, runs the pairs that chose its
    experts, and reduce-scatters the weighted outputs back (groups.ep)."""

    def __init__(self, num_experts, first, count, ep_group):
        self.num_experts, self.first, self.count, self.group = num_experts, first, count, ep_group

    def dispatch(self, x, probs, indices):
        """x [T, h], probs / indices [T, k] -> (tokens [N, h] sorted by local expert, counts: N per expert)."""
        k = indices.shape[1]
        if self.group is not None:
            x = gather_from_sequence_parallel_region(x, self.group)
            probs = gather_from_sequence_parallel_region(probs, self.group)
            indices = comm.all_gather_dim0(indices, self.group)
        expert = indices.reshape(-1)
        pairs = torch.nonzero((expert >= self.first) & (expert < self.first + self.count)).squeeze(1)
        order = torch.argsort(expert[pairs], stable=True)
        pairs = pairs[order]
        self.rows, self.weights, self.total = pairs // k, probs.reshape(-1)[pairs], x.shape[0]
        counts = torch.bincount(expert[pairs] - self.first, minlength=self.count).tolist()
        return x[self.rows], counts

    def combine(self, y):
        """y [N, h] (dispatch's order) -> [T, h]: sum over choices of prob x expert output."""
        out = weighted_sum(y, self.rows, self.weights, self.total)
        return reduce_scatter_to_sequence_parallel_region(out, self.group) if self.group is not None else out


class AllToAllDispatcher:
    """Each rank sorts its pairs by expert, exchanges the per-expert counts over groups.ep, then
    the tokens themselves (all-to-all with those counts); combine() sends the outputs back."""

    def __init__(self, num_experts, first, count, ep_group):
        self.num_experts, self.first, self.count, self.group = num_experts, first, count, ep_group
        self.ep = comm.world(ep_group) if ep_group is not None else 1

    def dispatch(self, x, probs, indices):
        k = indices.shape[1]
        expert = indices.reshape(-1)
        per_expert = torch.bincount(expert, minlength=self.num_experts + 1)[:self.num_experts]
        # dropped pairs (index E, capacity.py) sort last and are cut off
        order = torch.argsort(expert, stable=True)[:int(per_expert.sum())]
        self.rows, self.weights, self.total = order // k, probs.reshape(-1)[order], x.shape[0]
        tokens = x[self.rows]
        if self.group is None:
            return tokens, per_expert.tolist()
        # [source rank, local expert]: how many pairs each EP rank sends to each of my experts
        recv = torch.empty_like(per_expert)
        with waiting("all-to-all (token counts)", self.group):
            dist.all_to_all_single(recv, per_expert, group=self.group)
        recv = recv.view(self.ep, self.count)
        self.send_splits = per_expert.view(self.ep, self.count).sum(1).tolist()
        self.recv_splits = recv.sum(1).tolist()
        received = _AllToAll.apply(tokens, self.group, self.recv_splits, self.send_splits)
        # received is ordered (source rank, expert): regroup as (expert, source rank)
        starts = torch.cumsum(recv.reshape(-1), 0) - recv.reshape(-1)
        segments = [torch.arange(int(starts[r * self.count + e]), int(starts[r * self.count + e] + recv[r, e]))
                    for e in range(self.count) for r in range(self.ep)]
        self.regroup = torch.cat(segments).to(x.device) if segments else starts.new_zeros(0)
        return received[self.regroup], recv.sum(0).tolist()

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


def build_dispatcher(kind, num_experts, first, count, ep_group):
    """kind: 'allgather' or 'alltoall'; ep_group None without expert parallelism."""
    cls = AllGatherDispatcher if kind == "allgather" else AllToAllDispatcher
    return cls(num_experts, first, count, ep_group)
