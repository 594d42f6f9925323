"""Autograd collectives over the tensor-parallel group.

Each function is a pair (forward, backward) that are adjoint to each other, so the
gradient of a TP layer equals the gradient of its dense equivalent:

    copy_to      fwd identity           bwd all-reduce
    reduce_from  fwd all-reduce         bwd identity
    scatter_to   fwd split last dim     bwd all-gather last dim
    gather_from  fwd all-gather last    bwd split last dim
Sequence parallel (activations [s, b, h] split along s, dim 0):
    scatter_to_sequence   fwd split dim 0        bwd all-gather dim 0
    gather_from_sequence  fwd all-gather dim 0   bwd reduce-scatter dim 0 (or split)
    reduce_scatter_to_sequence  fwd reduce-scatter dim 0  bwd all-gather dim 0

Every function takes the group it talks to: the caller's (a layer is given its groups when built).
"""
import torch
import torch.distributed as dist

from .. import comm


def _split_last(x, group):
    size = comm.world(group)
    if size == 1:
        return x
    if x.shape[-1] % size:
        raise ValueError(f"last dim {x.shape[-1]} not divisible by TP size {size}")
    return x.chunk(size, dim=-1)[dist.get_rank(group)].contiguous()


def _gather_last(x, group):
    size = comm.world(group)
    if size == 1:
        return x
    # all-gather along dim 0 of a transposed copy keeps one collective call path
    gathered = comm.all_gather_dim0(x.movedim(-1, 0), group)
    return gathered.movedim(0, -1).contiguous()


def _sum(x, group):
    """All-reduce (sum) into a new tensor. Never in place: x may be saved for backward by
    the op that produced it (exp, softmax, ...), or be a gradient autograd also hands to
    another consumer of the same tensor (a residual); reducing it in place silently
    corrupts those gradients."""
    if comm.world(group) == 1:
        return x
    return comm.all_reduce_(x.clone(memory_format=torch.contiguous_format), group)


def _split_first(x, group):
    size = comm.world(group)
    if size == 1:
        return x
    if x.shape[0] % size:
        raise ValueError(f"sequence length {x.shape[0]} not divisible by TP size {size} "
                         "(sequence parallel needs --seq-length divisible by TP)")
    return x.chunk(size, dim=0)[dist.get_rank(group)].contiguous()


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return _sum(g, ctx.group), None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _sum(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ScatterLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, g):
        return _gather_last(g, ctx.group), None


class _GatherLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, g):
        return _split_last(g, ctx.group), None


class _ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_first(x, group)

    @staticmethod
    def backward(ctx, g):
        return comm.all_gather_dim0(g, ctx.group), None


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, grad_is_partial):
        ctx.group, ctx.grad_is_partial = group, grad_is_partial
        return comm.all_gather_dim0(x, group)

    @staticmethod
    def backward(ctx, g):
        if ctx.grad_is_partial:
            return comm.reduce_scatter_dim0(g, ctx.group), None, None
        return _split_first(g, ctx.group), None, None


class _ReduceScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.reduce_scatter_dim0(x, group)

    @staticmethod
    def backward(ctx, g):
        return comm.all_gather_dim0(g, ctx.group), None


def copy_to_tensor_model_parallel_region(x, group):
    """Identity forward; all-reduce of the gradient over the TP group. Any shape."""
    return x if comm.world(group) == 1 else _Copy.apply(x, group)


def reduce_from_tensor_model_parallel_region(x, group):
    """All-reduce (sum) over the TP group forward; identity backward. Any shape."""
    return x if comm.world(group) == 1 else _Reduce.apply(x, group)


def scatter_to_tensor_model_parallel_region(x, group):
    """[..., h] -> this rank's [..., h/TP]; backward all-gathers over the TP group."""
    return x if comm.world(group) == 1 else _ScatterLast.apply(x, group)


def gather_from_tensor_model_parallel_region(x, group):
    """[..., h/TP] -> [..., h] all-gathered over the TP group; backward keeps this rank's slice."""
    return x if comm.world(group) == 1 else _GatherLast.apply(x, group)


def scatter_to_sequence_parallel_region(x, group):
    """[s, ...] -> this rank's [s/TP, ...]; backward all-gathers along dim 0 (TP group)."""
    return x if comm.world(group) == 1 else _ScatterSeq.apply(x, group)


def gather_from_sequence_parallel_region(x, group, tensor_parallel_output_grad=True):
    """[s/TP, ...] -> [s, ...] all-gathered over the TP group.

    Backward reduce-scatters when the consumer is TP-parallel (each rank holds a
    partial gradient of the full sequence), else keeps this rank's slice.
    """
    return x if comm.world(group) == 1 else _GatherSeq.apply(x, group, tensor_parallel_output_grad)


def reduce_scatter_to_sequence_parallel_region(x, group):
    """[s, ...] partial sums -> this rank's [s/TP, ...] of the TP-group sum; backward all-gathers."""
    return x if comm.world(group) == 1 else _ReduceScatterSeq.apply(x, group)
