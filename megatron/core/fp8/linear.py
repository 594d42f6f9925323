"""y = x W^T + b with the three GEMMs in FP8 (recipes.py), fp32 accumulation; x, W, b and the gradients
returned keep their own dtypes (master weights stay fp32 / bf16). Each backward GEMM runs only where the
running backward uses it (backward_needs.py): under a zero-bubble split the input gradient in B, the
weight gradient in W; both cast g the same way (the same reduced amax), so the split changes nothing.
With `pieces` the rows are cast in parts, each with its own scales, and the parts' weight gradients summed.
With gradient-accumulation fusion (tensor_parallel/wgrad_fusion.py) the fp32 weight gradient goes into the
weight's grad sink (DDP's buffer), as the other linears' do, and autograd gets None for it.
"""
import torch

from ..backward_needs import needs_grad


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe, pieces):
        k = x.shape[-1]
        rows = x.reshape(-1, k)
        parts = [rows] if pieces is None else rows.split(pieces)
        outs, saved = [], []
        for part in parts:  # each piece cast with its own scales (one process's micro-batch each)
            y, kept = recipe.forward_gemm(part, weight)
            outs.append(y)
            saved.append(kept)
        ctx.save_for_backward(weight, *[t for kept in saved for t in kept])  # FP8 copies, scales: seen by hooks
        ctx.per_piece, ctx.pieces = len(saved[0]), pieces
        ctx.recipe, ctx.x_shape, ctx.has_bias = recipe, x.shape, bias is not None
        ctx.dtypes = (x.dtype, weight.dtype)
        y = (outs[0] if len(outs) == 1 else torch.cat(outs)).to(x.dtype).view(*x.shape[:-1], weight.shape[0])
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
            gs = [g] if ctx.pieces is None else g.split(ctx.pieces)
            casts = [ctx.recipe.cast_grad(gp) for gp in gs]
            if want_x:
                parts = [ctx.recipe.dgrad(gc, kept) for gc, kept in zip(casts, saved)]
                grad_x = (parts[0] if len(parts) == 1 else torch.cat(parts)).to(ctx.dtypes[0]).view(ctx.x_shape)
            if want_w:
                # here, not at the top: tensor_parallel's layers import this module
                from ..tensor_parallel.wgrad_fusion import deposit
                total = None
                for gc, kept in zip(casts, saved):  # the pieces' fp32 weight gradients summed, deposited once
                    part = ctx.recipe.wgrad(gc, kept)
                    total = part if total is None else total + part
                grad_w = deposit(weight, total)
                grad_w = None if grad_w is None else grad_w.to(ctx.dtypes[1])
        if ctx.has_bias and needs_grad(ctx, 2):
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b, None, None


def fp8_linear(x, weight, bias, recipe, pieces=None):
    """x [..., K], weight [N, K], bias [N] or None; recipe: a recipes.build_recipe module. pieces: row counts
    of x's consecutive parts to cast each with its own scales (an expert's input holding several micro-batches
    under expert parallelism: one piece per source rank, as one process casts each micro-batch), or None."""
    return _Fp8Linear.apply(x, weight, bias, recipe, pieces)
