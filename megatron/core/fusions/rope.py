"""Rotary embedding front: "csrc" (one elementwise kernel each way, reading q / k where they
lie in the fused QKV output), "torch" or "compiled" (torch's under torch.compile); which one
a module runs: kernel_table.choose.

apex and Transformer Engine have fused RoPE too, but they take the angles, not cos / sin,
and TE's layout options differ by version; our kernel covers the same need.
"""
import torch

from ..transformer.rope import apply_rope as torch_apply_rope
from . import _ext
from ._common import compiled, compiled_fits, csrc_ok_for, kernel_choice


def choice(enabled, device, dtype, force="auto"):
    """('csrc' | 'torch', why) for the rotary embedding of tensors of dtype on device."""
    return kernel_choice("rope", device, dtype, enabled, force, "--no-rope-fusion")


def select(enabled, device, dtype, force="auto"):
    return choice(enabled, device, dtype, force)[0]


class _CsrcRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)  # the map is linear: its input is not needed
        return _ext.load().rope_apply(_last_dim_dense(x), cos, sin, False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _ext.load().rope_apply(_last_dim_dense(grad), cos, sin, True), None, None


def _last_dim_dense(t):
    """t itself when the kernel can read it where it lies (4-D, last dim contiguous), else a copy."""
    return t if t.dim() == 4 and t.stride(-1) == 1 else t.contiguous()


def apply_rope(x, cos, sin, impl="torch"):
    """x [s, b, heads, d]; cos, sin [s, 1, 1, r] -> rotated x (rotate-half convention; r < d, partial
    rotary, runs torch: the kernel rotates whole heads)."""
    if (impl == "csrc" and x.dim() == 4 and csrc_ok_for(x, cos, sin) and cos.dtype == sin.dtype == x.dtype
            and cos.is_contiguous() and sin.is_contiguous()
            and cos.numel() == sin.numel() == x.shape[0] * x.shape[-1]):
        return _CsrcRope.apply(x, cos, sin)
    if impl == "compiled" and compiled_fits(x, cos, sin):
        return compiled(torch_apply_rope)(x, cos, sin)
    return torch_apply_rope(x, cos, sin)
