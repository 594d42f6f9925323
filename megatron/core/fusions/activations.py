"""Bias + GeLU and bias + SwiGLU fronts for the MLP.

"csrc" fuses the bias add into the activation (the linear layer then skips its bias) and
sums the bias gradient in the backward's pass; "torch" is F.gelu (exact, erf) or
F.silu(gate) * up; "compiled" is that under torch.compile. There is no apex or Transformer
Engine candidate: neither exposes these as standalone functions. Which one a module runs: kernel_table.choose.
"""
import torch
import torch.nn.functional as F

from . import _ext
from ._common import compiled, compiled_fits, csrc_ok_for, kernel_choice


def choice(enabled, device, dtype, swiglu=False, force="auto"):
    """('csrc' | 'torch', why) for bias + GeLU (bias + SwiGLU: swiglu=True) over tensors of dtype on device."""
    if swiglu:
        return kernel_choice("bias-swiglu", device, dtype, enabled, force, "--no-bias-swiglu-fusion")
    return kernel_choice("bias-gelu", device, dtype, enabled, force, "--no-bias-gelu-fusion")


def select(enabled, device, dtype, swiglu=False, force="auto"):
    return choice(enabled, device, dtype, swiglu, force)[0]


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
        # the kernel sums the bias gradient in the same pass (fp32, over the unrounded dx)
        dx, dbias = (ext.swiglu_backward if ctx.swiglu else ext.bias_gelu_backward)(grad.contiguous(), x, bias)
        return dx, (dbias if ctx.needs_input_grad[1] else None), None


def _csrc_fits(x, bias):
    return csrc_ok_for(x, bias) and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))


def bias_gelu(x, bias=None, impl="torch", approximate="none"):
    """gelu(x + bias); x [..., f], bias [f] or None. approximate="tanh" (--openai-gelu, GPT-2's)
    always takes the torch path: the kernel computes the exact (erf) GeLU."""
    if impl == "csrc" and approximate == "none" and _csrc_fits(x, bias):
        return _CsrcBiasAct.apply(x, bias, False)
    if impl == "compiled" and compiled_fits(x, bias):
        return compiled(torch_bias_gelu)(x, bias, approximate)
    return torch_bias_gelu(x, bias, approximate)


def bias_swiglu(x, bias=None, impl="torch"):
    """silu(gate) * up for [gate | up] = x + bias; x [..., 2f], bias [2f] or None -> [..., f]."""
    if impl == "csrc" and _csrc_fits(x, bias):
        return _CsrcBiasAct.apply(x, bias, True)
    if impl == "compiled" and compiled_fits(x, bias):
        return compiled(torch_bias_swiglu)(x, bias)
    return torch_bias_swiglu(x, bias)
