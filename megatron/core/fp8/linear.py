"""y = x W^T + b with the three GEMMs in FP8 (recipes.py), fp32 accumulation; x, W, b and the gradients
returned keep their own dtypes (master weights stay fp32 / bf16). Each backward GEMM runs only where the
running backward uses it (backward_needs.py): under a zero-bubble split the input gradient in B, the
weight gradient in W; both cast g the same way (the same reduced amax), so the split changes nothing.
With `blocks` (RowBlocks) the rows hold several micro-batches: each micro-batch's rows are cast with their
own scales, and the parts' weight gradients summed.
With gradient-accumulation fusion (tensor_parallel/wgrad_fusion.py) the fp32 weight gradient goes into the
weight's grad sink (DDP's buffer), as the other linears' do, and autograd gets None for it.
"""
import itertools

import torch

from ..backward_needs import needs_grad


class RowBlocks:
    """An input's rows as consecutive blocks, each from one micro-batch (an expert's input under expert parallelism
    or folding: a block per source rank, ParallelLayout.expert_row_sources): sizes, the blocks' micro-batches
    (of n). One process casts each micro-batch's rows with one scale, so the blocks of one micro-batch are cast
    together (in their order), one part per micro-batch, in the order micro-batches first appear; where one
    micro-batch's blocks are not consecutive the rows are permuted into parts (and the results back)."""

    def __init__(self, sizes, micro_batches, n):
        self.labels = list(dict.fromkeys(micro_batches))
        self.n = n
        self.sizes = [sum(k for k, m in zip(sizes, micro_batches) if m == label) for label in self.labels]
        runs = [m for i, m in enumerate(micro_batches) if i == 0 or micro_batches[i - 1] != m]
        self._ranges = None
        if len(runs) != len(self.labels):  # some micro-batch's blocks are apart
            starts = [0, *itertools.accumulate(sizes)]
            self._ranges = [(a, k) for label in self.labels for a, k, m in zip(starts, sizes, micro_batches)
                            if m == label]
        self._perm = None

    def permutation(self, device):
        """[rows] int64: the row of the input that each row of the parts is (None: the parts are the input's)."""
        if self._ranges is not None and self._perm is None:
            self._perm = torch.cat([torch.arange(a, a + k) for a, k in self._ranges]).to(device)
        return self._perm

    def split(self, rows):
        """[M, ...] in input order -> the parts (one per label)."""
        perm = self.permutation(rows.device)
        return (rows if perm is None else rows.index_select(0, perm)).split(self.sizes)

    def join(self, parts):
        """split()'s inverse: the parts' rows (results) -> [M, ...] in input order."""
        y = parts[0] if len(parts) == 1 else torch.cat(parts)
        perm = self.permutation(y.device)
        return y if perm is None else torch.empty_like(y).index_copy_(0, perm, y)


def _split(rows, blocks):
    return [rows] if blocks is None else list(blocks.split(rows))


def _join(parts, blocks):
    return (parts[0] if len(parts) == 1 else torch.cat(parts)) if blocks is None else blocks.join(parts)


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe, blocks):
        k = x.shape[-1]
        parts = _split(x.reshape(-1, k), blocks)
        labels, n = (None, None) if blocks is None else (blocks.labels, blocks.n)
        done = recipe.forward_gemms(parts, weight, labels, n)  # each part cast with its micro-batch's scales
        saved = [kept for _, kept in done]
        ctx.save_for_backward(weight, *[t for kept in saved for t in kept])  # FP8 copies, scales: seen by hooks
        ctx.per_piece, ctx.blocks = len(saved[0]), blocks
        ctx.recipe, ctx.x_shape, ctx.has_bias = recipe, x.shape, bias is not None
        ctx.dtypes = (x.dtype, weight.dtype)
        y = _join([y for y, _ in done], blocks).to(x.dtype).view(*x.shape[:-1], weight.shape[0])
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad):
        g = grad.reshape(-1, grad.shape[-1])
        want_x, want_w = needs_grad(ctx, 0), needs_grad(ctx, 1)
        grad_x = grad_w = grad_b = None
        if want_x or want_w:
            weight, *flat = ctx.saved_tensors
            n = ctx.per_piece
            saved = [flat[i:i + n] for i in range(0, len(flat), n)]
            blocks = ctx.blocks
            labels, count = (None, None) if blocks is None else (blocks.labels, blocks.n)
            casts = ctx.recipe.cast_grads(_split(g, blocks), labels, count)
            if want_x:
                parts = [ctx.recipe.dgrad(gc, kept) for gc, kept in zip(casts, saved)]
                grad_x = _join(parts, blocks).to(ctx.dtypes[0]).view(ctx.x_shape)
            if want_w:
                # here, not at the top: tensor_parallel's layers import this module
                from ..tensor_parallel.wgrad_fusion import deposit
                total = None
                for gc, kept in zip(casts, saved):  # the parts' fp32 weight gradients summed, deposited once
                    part = ctx.recipe.wgrad(gc, kept)
                    total = part if total is None else total + part
                grad_w = deposit(weight, total)
                grad_w = None if grad_w is None else grad_w.to(ctx.dtypes[1])
        if ctx.has_bias and needs_grad(ctx, 2):
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b, None, None


def fp8_linear(x, weight, bias, recipe, blocks=None):
    """x [..., K], weight [N, K], bias [N] or None; recipe: a recipes.build_recipe module. blocks: a RowBlocks of
    x's rows where they hold several micro-batches (an expert's input under expert parallelism or folding), cast
    each micro-batch with its own scales as one process casts it; None: x is one micro-batch's (or its piece)."""
    return _Fp8Linear.apply(x, weight, bias, recipe, blocks)
