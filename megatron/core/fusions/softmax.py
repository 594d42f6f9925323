"""Scaled masked softmax: softmax(scale * x) under a padding mask or the causal mask.

Semantics, the same for every implementation: `mask` is bool, broadcastable to x's
[b, heads, sq, sk] (e.g. [b or 1, 1, sq, sk], a padding mask [b, 1, 1, sk], or one per head),
True = masked out (Megatron-LM's convention); masked entries get probability 0 and a row with
every entry masked is all zeros (not NaN, not uniform). Causal masks column c of query row
q when c > q (top-left aligned, as torch SDPA's is_causal). The output has x's dtype.

Implementations: "csrc" (our kernel, CUDA, fp32 math, any row length), "apex" (apex's
Megatron kernel, causal only: its padding variant makes fully masked rows uniform; fp16/bf16
and the shapes it supports), "torch"; which one a module runs: kernel_table.choose (the
causal and the padding-mask softmax are measured apart). Used by the unfused attention path;
SDPA, flash-attn and Transformer Engine do their own softmax.
"""
import functools

import torch

from . import _ext
from ._common import HALF_DTYPES, compiled, compiled_fits, csrc_ok_for, importable, kernel_choice

_APEX = "scaled_upper_triang_masked_softmax_cuda"


def choice(enabled, device, dtype, causal=True, force="auto"):
    """('csrc' | 'apex' | 'torch', why) for tensors of dtype on device; enabled=False (flag) -> torch."""
    others = {}
    if not (causal and torch.device(device).type == "cuda" and dtype in HALF_DTYPES and importable(_APEX)):
        others["apex"] = "apex's causal softmax kernel is not installed" if causal else "apex takes no padding mask"
    op = "causal softmax" if causal else "masked softmax"
    return kernel_choice(op, device, dtype, enabled, force, "--no-masked-softmax-fusion", others)


def select(enabled, device, dtype, causal=True, force="auto"):
    return choice(enabled, device, dtype, causal, force)[0]


@functools.lru_cache(maxsize=8)
def _causal_bias(sq, sk, dtype, device):
    """0 on and below the diagonal, -inf above: added to the scores (an add keeps nothing for backward)."""
    return torch.full((sq, sk), float("-inf"), dtype=dtype, device=device).triu_(1)


def torch_scaled_masked_softmax(x, mask, scale=1.0, causal=False):
    """The reference: torch.softmax in x's dtype (torch accumulates in fp32 internally)."""
    y = x * scale if scale != 1.0 else x
    if causal:  # top-left causal: every row keeps column 0, so no row is fully masked
        return torch.softmax(y + _causal_bias(y.shape[-2], y.shape[-1], y.dtype, y.device), dim=-1)
    if mask is None:
        return torch.softmax(y, dim=-1)
    # a finite fill keeps fully masked rows finite; the second fill makes them zero
    y = y.masked_fill(mask, torch.finfo(y.dtype).min)
    return torch.softmax(y, dim=-1).masked_fill(mask, 0.0)


class _CsrcSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, scale, causal):
        y = _ext.load().softmax_forward(x.contiguous(), mask, scale, causal)
        ctx.save_for_backward(y)  # the output is all the backward needs
        ctx.scale, ctx.causal = scale, causal
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return _ext.load().softmax_backward(grad.contiguous(), y, ctx.scale, ctx.causal), None, None, None


class _ApexCausalSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        import scaled_upper_triang_masked_softmax_cuda as apex_softmax
        y = apex_softmax.forward(x, scale)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        import scaled_upper_triang_masked_softmax_cuda as apex_softmax
        (y,) = ctx.saved_tensors
        return apex_softmax.backward(grad.contiguous(), y, ctx.scale), None


def _apex_fits(x):
    # the limits Megatron-LM checks before calling this kernel (older apex: rows up to 2048)
    sq, sk = x.shape[-2:]
    return (x.is_cuda and x.dtype in HALF_DTYPES and sq == sk and 16 < sk <= 2048 and sk % 4 == 0
            and (x.numel() // (sq * sk)) % 4 == 0)


def kernel_operands(x, mask):
    """(x, mask) as the kernel binding takes them, or None when it cannot.

    x [b, heads, sq, sk] on CUDA; mask bool on x's device, broadcastable to x. Returns x (a view)
    and a contiguous bool mask [b or 1, 1, sq, sk]; a mask that differs per head folds the heads
    into the batch: x [b * heads, 1, sq, sk] and a mask of that shape.
    """
    if x.dim() != 4 or mask.dtype != torch.bool or mask.device != x.device or mask.dim() > 4:
        return None
    try:
        if torch.broadcast_shapes(mask.shape, x.shape) != x.shape:
            return None
    except RuntimeError:
        return None
    b, heads, sq, sk = x.shape
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if m.shape[1] != 1:
        return x.reshape(b * heads, 1, sq, sk), m.expand(b, heads, sq, sk).reshape(b * heads, 1, sq, sk).contiguous()
    return x, m.expand(m.shape[0], 1, sq, sk).contiguous()


def scaled_masked_softmax(x, mask, scale=1.0, impl=None):
    """x [b, heads, sq, sk]; mask bool broadcastable to x (True = masked) or None -> probabilities like x.

    impl: from select() (None: select now); an implementation that cannot take these
    tensors falls back to torch.
    """
    impl = impl or select(True, x.device, x.dtype, causal=False)
    if impl == "csrc" and csrc_ok_for(x):
        if mask is None:
            return _CsrcSoftmax.apply(x, None, float(scale), False)
        operands = kernel_operands(x, mask)
        if operands is not None:
            return _CsrcSoftmax.apply(*operands, float(scale), False).view(x.shape)
    if impl == "compiled" and compiled_fits(x, mask):
        return compiled(torch_scaled_masked_softmax)(x, mask, scale)
    return torch_scaled_masked_softmax(x, mask, scale)


def scaled_upper_triang_masked_softmax(x, scale=1.0, impl=None):
    """Causal softmax of x [..., sq, sk] -> probabilities like x."""
    impl = impl or select(True, x.device, x.dtype, causal=True)
    if impl == "csrc" and csrc_ok_for(x):
        return _CsrcSoftmax.apply(x, None, float(scale), True)
    if impl == "apex" and _apex_fits(x):
        sq, sk = x.shape[-2:]
        return _ApexCausalSoftmax.apply(x.reshape(-1, sq, sk).contiguous(), float(scale)).view(x.shape)
    if impl == "compiled" and compiled_fits(x):
        return compiled(torch_scaled_masked_softmax)(x, None, scale, causal=True)
    return torch_scaled_masked_softmax(x, None, scale, causal=True)
