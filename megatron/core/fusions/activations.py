"""Bias + GeLU and bias + SwiGLU fronts for the MLP.

"csrc" fuses the bias add into the activation (the linear layer then skips its bias);
"torch" is F.gelu (exact, erf) or F.silu(gate) * up. There is no apex or Transformer Engine
candidate: neither exposes these as standalone functions.
"""
import torch
import torch.nn.functional as F

from ..backward_needs import needs_grad
from . import _ext
from ._common import csrc_ok, csrc_ok_for


def select(enabled, device, dtype):
    """'csrc' | 'torch' (same rule for GeLU and SwiGLU)."""
    return "csrc" if enabled and csrc_ok(device, dtype) else "torch"


def torch_bias_gelu(x, bias=None, approximate="none"):
    return F.gelu(x if bias is None else x + bias, approximate=approximate)


def torch_bias_swiglu(x, bias=None):
    gate, up = (x if bias is None else x + bias).chunk(2, dim=-1)
    return F.silu(gate) * up


class _CsrcBiasAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, swiglu):
        ext = _ext.load()
        x = x.contiguous()
        y = (ext.swiglu_forward if swiglu else ext.bias_gelu_forward)(x, bias)
        ctx.save_for_backward(x, bias)  # the activation's input is recomputed from these
        ctx.swiglu = swiglu
        return y

    @staticmethod
    def backward(ctx, grad):
        ext = _ext.load()
        x, bias = ctx.saved_tensors
        dx = (ext.swiglu_backward if ctx.swiglu else ext.bias_gelu_backward)(grad.contiguous(), x, bias)
        dbias = dx.reshape(-1, dx.shape[-1]).sum(0) if bias is not None and needs_grad(ctx, 1) else None
        return dx, dbias, None


def _csrc_fits(x, bias):
    return csrc_ok_for(x, bias) and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))


def bias_gelu(x, bias=None, impl="torch", approximate="none"):
    """gelu(x + bias); x [..., f], bias [f] or None. approximate="tanh" (--openai-gelu, GPT-2's)
    always takes the torch path: the kernel computes the exact (erf) GeLU."""
    if impl == "csrc" and approximate == "none" and _csrc_fits(x, bias):
        return _CsrcBiasAct.apply(x, bias, False)
    return torch_bias_gelu(x, bias, approximate)


def bias_swiglu(x, bias=None, impl="torch"):
    """silu(gate) * up for [gate | up] = x + bias; x [..., 2f], bias [2f] or None -> [..., f]."""
    if impl == "csrc" and _csrc_fits(x, bias):
        return _CsrcBiasAct.apply(x, bias, True)
    return torch_bias_swiglu(x, bias)
