"""y = x W^T + b with the three GEMMs in FP8 (recipes.py), fp32 accumulation; x, W, b and the gradients
returned keep their own dtypes (master weights stay fp32 / bf16). Each backward GEMM runs only where the
running backward uses it (backward_needs.py): under a zero-bubble split the input gradient in B, the
weight gradient in W; both cast g the same way (the same reduced amax), so the split changes nothing.
With gradient-accumulation fusion (tensor_parallel/wgrad_fusion.py) the fp32 weight gradient goes into the
weight's grad sink (DDP's buffer), as the other linears' do, and autograd gets None for it.
"""
import torch

from ..backward_needs import needs_grad


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe):
        k = x.shape[-1]
        y, saved = recipe.forward_gemm(x.reshape(-1, k), weight)
        ctx.save_for_backward(weight, *saved)  # FP8 copies, scales: seen by saved-tensor hooks
        ctx.recipe, ctx.x_shape, ctx.has_bias = recipe, x.shape, bias is not None
        ctx.dtypes = (x.dtype, weight.dtype)
        y = y.to(x.dtype).view(*x.shape[:-1], weight.shape[0])
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad):
        g = grad.reshape(-1, grad.shape[-1])
        want_x, want_w = needs_grad(ctx, 0), needs_grad(ctx, 1)
        grad_x = grad_w = grad_b = None
        if want_x or want_w:
            weight, *saved = ctx.saved_tensors
            gc = ctx.recipe.cast_grad(g)
            if want_x:
                grad_x = ctx.recipe.dgrad(gc, saved).to(ctx.dtypes[0]).view(ctx.x_shape)
            if want_w:
                # here, not at the top: tensor_parallel's layers import this module
                from ..tensor_parallel.wgrad_fusion import deposit
                grad_w = deposit(weight, ctx.recipe.wgrad(gc, saved))
                grad_w = None if grad_w is None else grad_w.to(ctx.dtypes[1])
        if ctx.has_bias and needs_grad(ctx, 2):
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b, None


def fp8_linear(x, weight, bias, recipe):
    """x [..., K], weight [N, K], bias [N] or None; recipe: a recipes.build_recipe module."""
    return _Fp8Linear.apply(x, weight, bias, recipe)
