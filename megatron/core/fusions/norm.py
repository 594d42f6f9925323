"""LayerNorm and RMSNorm fronts.

Implementations: "csrc" (our kernel: fp32 statistics, keeps the input and fp32 mean / rstd
for the backward; weights of the input's dtype or fp32), "apex" (apex.normalization's
fused_layer_norm_affine / fused_rms_norm_affine), "torch" (F.layer_norm; RMSNorm with fp32
statistics, written out), "compiled" (the torch function under torch.compile). Which one a
module runs: kernel_table.choose (torch unless a GPU result on file says otherwise).
"""
import torch
import torch.nn.functional as F

from . import _ext
from ._common import compiled, compiled_fits, csrc_ok_for, importable, kernel_choice

_APEX = "apex.normalization.fused_layer_norm"


def choice(enabled, device, dtype, rms=False, force="auto"):
    """('csrc' | 'apex' | 'torch', why) for a LayerNorm (RMSNorm: rms=True) over tensors of dtype on device."""
    others = {} if torch.device(device).type == "cuda" and importable(_APEX) else {"apex": "apex is not installed"}
    return kernel_choice("rmsnorm" if rms else "layernorm", device, dtype, enabled, force, "--no-norm-fusion", others)


def select(enabled, device, dtype, rms=False, force="auto"):
    return choice(enabled, device, dtype, rms, force)[0]


def torch_rms_norm(x, weight, eps):
    # statistics in fp32 even for bf16 activations (fp64 stays fp64)
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


def torch_layer_norm(x, weight, bias, eps):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def residual_layer_norm(x, residual, weight, bias, eps):
    """(residual + x, its LayerNorm): compiled, one kernel each way (the backward adds the residual's gradient)."""
    s = residual + x
    return s, F.layer_norm(s, s.shape[-1:], weight, bias, eps)


def residual_rms_norm(x, residual, weight, eps):
    """(residual + x, its RMSNorm), as residual_layer_norm."""
    s = residual + x
    return s, torch_rms_norm(s, weight, eps)


def residual_fusion_fits(*tensors):
    """--residual-norm-fusion runs compiled: CUDA tensors and triton (torch.compile's GPU backend)."""
    return compiled_fits(*tensors) and importable("triton")


class _CsrcNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms):
        x = x.contiguous()
        y, mean, rstd = _ext.load().norm_forward(x, weight, bias, eps, rms)
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.rms, ctx.has_bias = rms, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        x, mean, rstd, weight = ctx.saved_tensors
        dx, dw, db = _ext.load().norm_backward(grad.contiguous(), x, mean, rstd, weight, ctx.rms, ctx.has_bias)
        return dx, dw, db, None, None


def _csrc_fits(x, weight, bias):
    return (csrc_ok_for(x, weight, bias) and weight.is_contiguous()
            and weight.dtype in (x.dtype, torch.float32)
            and (bias is None or (bias.dtype == weight.dtype and bias.is_contiguous())))


def layer_norm(x, weight, bias, eps, impl="torch"):
    """LayerNorm over the last dim of x [..., h]; weight, bias [h]."""
    if impl == "csrc" and _csrc_fits(x, weight, bias):
        return _CsrcNorm.apply(x, weight, bias, float(eps), False)
    if impl == "apex" and x.is_cuda:
        from apex.normalization.fused_layer_norm import fused_layer_norm_affine
        return fused_layer_norm_affine(x, weight, bias, x.shape[-1:], eps)
    if impl == "compiled" and compiled_fits(x, weight, bias):
        return compiled(torch_layer_norm)(x, weight, bias, eps)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def rms_norm(x, weight, eps, impl="torch"):
    """RMSNorm over the last dim of x [..., h]: x / sqrt(mean(x^2) + eps) * weight."""
    if impl == "csrc" and _csrc_fits(x, weight, None):
        return _CsrcNorm.apply(x, weight, None, float(eps), True)
    if impl == "apex" and x.is_cuda:
        from apex.normalization.fused_layer_norm import fused_rms_norm_affine
        return fused_rms_norm_affine(x, weight, x.shape[-1:], eps)
    if impl == "compiled" and compiled_fits(x, weight):
        return compiled(torch_rms_norm)(x, weight, eps)
    return torch_rms_norm(x, weight, eps)
