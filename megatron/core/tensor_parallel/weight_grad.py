"""The backward split in two for zero-bubble pipeline schedules: B (input gradients) now,
W (weight gradients) later.

While `splitting()` is on (the executor turns it on for a schedule with W actions), the
layers route their parameter ops through the autograd functions below: linear (column and
row parallel, the sequence-parallel one too), the norms' affine and the embedding lookup;
any other op with a parameter takes it through deferred().
Their backward computes the input gradient; inside `deferring()` (one B action) the
weight-gradient work is kept instead of done, and `apply()` (the W action) runs it.
The functions see the parameters detached: autograd runs a parameter's AccumulateGrad (and
its hooks) even for a None gradient, so the graph must have no edge to it at all.

W hands the gradients to autograd as a backward from each parameter itself
(torch.autograd.backward(params, grads)): the parameters' AccumulateGrad runs once per
microbatch, so .grad accumulates and the post-accumulate-grad hooks (DDP's main_grad and
bucket counting, its overlapped reduction) fire exactly as after an ordinary backward.
A parameter used twice in a microbatch (a tied table on one stage) gets the sum, once; one
used both here and by a plain autograd op would get two (DDP counts microbatches by them).
Outside `deferring()` the same functions compute everything in the backward.
"""
import contextlib
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .. import comm
from . import wgrad_fusion

_split = False
_pending: Optional[list] = None  # (params, fn) of the B action running now


@contextlib.contextmanager
def splitting(on: bool = True):
    """Forwards run inside build graphs whose weight gradients can be deferred."""
    global _split
    prev, _split = _split, on
    try:
        yield
    finally:
        _split = prev


def split_enabled() -> bool:
    return _split


@contextlib.contextmanager
def deferring():
    """Collect the weight-gradient work of the backward run inside; yields the list for apply()."""
    global _pending
    prev, _pending = _pending, []
    try:
        yield _pending
    finally:
        _pending = prev


def now_or_later(params, fn: Callable[[], tuple]) -> None:
    """For a custom autograd function's backward whose parameters it was given detached:
    fn() -> one gradient per param (same shapes), kept for W inside deferring(), else
    accumulated now (the hooks fire per call). The building block of the functions below."""
    params = tuple(p for p in params if p is not None)
    if _pending is None:
        apply([(params, fn)])
    else:
        _pending.append((params, fn))


def apply(work: list) -> None:
    """Run deferred work (a deferring() list): accumulate each parameter's summed gradient
    through autograd, so .grad and the post-accumulate-grad hooks see one gradient."""
    sums = {}
    for params, fn in work:
        for p, g in zip(params, fn()):
            if g is not None and p.requires_grad:
                sums[p] = (p, g) if p not in sums else (p, sums[p][1] + g)
    work.clear()
    if sums:
        params, grads = zip(*sums.values())
        torch.autograd.backward(params, grads)


def _anchor(x):
    """An empty leaf that requires grad where x does not: it keeps a function's output in the
    graph (the parameters are passed detached) so that backward reaches the weight work."""
    if x.requires_grad or not torch.is_grad_enabled():
        return None
    return torch.empty(0, device=x.device, requires_grad=True)


anchor = _anchor  # for the deferrable functions defined next to their layers (moe/grouped_gemm.py)


def _detach(t):
    return None if t is None else t.detach()


def _flat(t):
    return t.reshape(-1, t.shape[-1])


class _Linear(torch.autograd.Function):
    """y = x W^T + b; with gather_group, x is this rank's sequence shard [s/TP, ...] and the
    product uses the gathered [s, ...] (sequence parallelism; the shard is what is saved)."""

    @staticmethod
    def forward(ctx, x, weight, bias, gather_group, anchor, params):
        ctx.save_for_backward(x)
        ctx.weight, ctx.group, ctx.params = weight, gather_group, params
        total = comm.all_gather_dim0(x, gather_group) if gather_group is not None else x
        return F.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        weight, group, (_, bias) = ctx.weight, ctx.group, ctx.params
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        total = x
        if group is not None:
            if grad_x is not None:
                grad_x = comm.reduce_scatter_dim0(grad_x, group)  # partial sums over TP
            total = comm.all_gather_dim0(x, group)  # gathered now: W needs no collective

        def weight_grads():  # the weight's: None where it went to its grad sink (wgrad_fusion.py)
            g = _flat(grad)
            return (wgrad_fusion.weight_gradient(ctx.params[0], g, _flat(total)),) + \
                (() if bias is None else (g.sum(0),))

        now_or_later(ctx.params, weight_grads)
        return grad_x, None, None, None, None, None


def linear(x, weight, bias=None, gather_group=None, added_later=None):
    """F.linear(x [..., in], weight [out, in], bias [out]) -> [..., out] with a deferrable
    weight gradient. gather_group: all-gather x along dim 0 over that TP group first.
    added_later: a skip_bias_add bias [out] that the caller adds to the output unchanged (a fused
    bias-activation): not added here, its gradient (the output gradient's sum) computed in W."""
    params = (weight, bias if added_later is None else added_later)
    return _Linear.apply(x, weight.detach(), _detach(bias), gather_group, _anchor(x), params)


class _Affine(torch.autograd.Function):
    """y = x_hat * weight (+ bias) over the last dim: the parameter part of a norm."""

    @staticmethod
    def forward(ctx, x_hat, weight, bias, params):
        ctx.save_for_backward(x_hat)
        ctx.weight, ctx.params = weight, params
        y = x_hat * weight
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad):
        (x_hat,) = ctx.saved_tensors
        bias = ctx.params[1]

        def weight_grads():
            g = _flat(grad)
            return ((g * _flat(x_hat)).sum(0),) + (() if bias is None else (g.sum(0),))

        now_or_later(ctx.params, weight_grads)
        return grad * ctx.weight, None, None, None


def layer_norm(x, weight, bias, eps):
    """LayerNorm over the last dim of x [..., h] (weight, bias [h]): torch's normalisation,
    then the affine with deferrable gradients."""
    return _Affine.apply(F.layer_norm(x, x.shape[-1:], None, None, eps), weight.detach(), _detach(bias), (weight, bias))


def rms_norm(x, weight, eps):
    """x [..., h] / sqrt(mean(x^2) + eps) * weight [h], statistics in fp32 as norm_front's."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    x_hat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return _Affine.apply(x_hat, weight.detach(), None, (weight, None))


class _BiasAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, bias, params):
        ctx.params = params
        return y + bias

    @staticmethod
    def backward(ctx, grad):
        now_or_later(ctx.params, lambda: (_flat(grad).sum(0),))
        return grad, None, None


def add_bias(y, bias):
    """y [..., h] + bias [h], the bias gradient deferrable."""
    return _BiasAdd.apply(y, bias.detach(), (bias,))


class _Embedding(torch.autograd.Function):
    """table[ids]: no input gradient, so B has nothing to do and W does it all."""

    @staticmethod
    def forward(ctx, ids, table, anchor, params):
        ctx.save_for_backward(ids)
        ctx.table = params[0]
        return F.embedding(ids, table)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        table = ctx.table

        def weight_grads():
            out = torch.zeros_like(table)
            return (out.index_add_(0, ids.reshape(-1), _flat(grad)),)

        now_or_later((table,), weight_grads)
        return None, None, None, None


def embedding(ids, table):
    """F.embedding(ids [...], table [n, h]) -> [..., h], the table's gradient deferrable."""
    return _Embedding.apply(ids, table.detach(), _anchor(ids), (table,))


class _Deferred(torch.autograd.Function):
    """p (a copy) for any op: that op's backward computes p's gradient, W accumulates it."""

    @staticmethod
    def forward(ctx, p, anchor, params):
        ctx.params = params
        return p.clone()

    @staticmethod
    def backward(ctx, grad):
        now_or_later(ctx.params, lambda: (grad,))
        return None, None, None


def deferred(p):
    """p [any shape] for an op that is none of the functions above: the op's backward computes the
    gradient in B, as the ordinary backward does, but it reaches p (.grad, its hooks) in W."""
    return _Deferred.apply(p.detach(), _anchor(p.detach()), (p,))


def skipped_bias(bias):
    """A skip_bias_add row-parallel linear's bias [out] (or None) for the caller that adds it."""
    return deferred(bias) if _split and bias is not None else bias


def detached_while_splitting(bias):
    """A skip_bias_add column-parallel linear's bias [out] (or None) for the caller: detached
    while splitting, as linear(..., added_later=bias) computes its gradient in W."""
    return _detach(bias) if _split else bias
