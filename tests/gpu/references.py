"""The math of every fused kernel written out with elementary torch ops, for the GPU tests.

Deliberately not our fronts' torch fallbacks and not torch's own fused functions (F.softmax,
F.layer_norm, F.gelu, ...): a formula shared by a kernel's front and its fallback would pass a
comparison of the two however wrong it is. Each function computes in the dtype of its inputs;
the GPU tests hand them float64 copies of the kernels' (rounded) inputs. On CPU,
tests/unit/test_kernel_references.py checks each against torch's functions in float64.
"""
import math

import torch

GELU_TANH_C = math.sqrt(2.0 / math.pi)


def masked_softmax(x, scale, mask=None, causal=False):
    """softmax(scale * x) over the last dim of x [..., sq, sk]; mask bool broadcastable to x
    (True = masked out); causal masks column c of row q when c > q. Masked entries are 0 and a
    row with every entry masked is all zeros."""
    v = x * scale
    keep = torch.ones(v.shape, dtype=torch.bool, device=v.device)
    if mask is not None:
        keep = keep & ~mask
    if causal:
        rows = torch.arange(v.shape[-2], device=v.device).unsqueeze(-1)
        keep = keep & (torch.arange(v.shape[-1], device=v.device) <= rows)
    neg_inf = torch.tensor(float("-inf"), dtype=v.dtype, device=v.device)
    row_max = torch.where(keep, v, neg_inf).amax(-1, keepdim=True).detach()  # a shift: the result ignores it
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(torch.where(keep, v - row_max, neg_inf))
    total = e.sum(-1, keepdim=True)
    nonempty = total > 0
    return torch.where(nonempty, e / torch.where(nonempty, total, torch.ones_like(total)), torch.zeros_like(e))


def layer_norm(x, weight, bias, eps):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance)."""
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    centered = x - mean
    var = (centered * centered).sum(-1, keepdim=True) / x.shape[-1]
    return centered / torch.sqrt(var + eps) * weight + bias


def rms_norm(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * weight


def bias_gelu(x, bias=None, approximate="none"):
    """GeLU of x + bias: exact, 0.5 v (1 + erf(v / sqrt 2)); or approximate="tanh",
    0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3)))."""
    v = x if bias is None else x + bias
    if approximate == "tanh":
        return 0.5 * v * (1.0 + torch.tanh(GELU_TANH_C * (v + 0.044715 * v * v * v)))
    return 0.5 * v * (1.0 + torch.erf(v / math.sqrt(2.0)))


def bias_swiglu(x, bias=None):
    """x + bias = [gate | up] on the last dim -> gate * sigmoid(gate) * up (half the width)."""
    v = x if bias is None else x + bias
    half = v.shape[-1] // 2
    gate, up = v[..., :half], v[..., half:]
    return gate / (1.0 + torch.exp(-gate)) * up


def rope(x, cos, sin):
    """Rotate-half rotary embedding: x [s, ..., d], cos / sin broadcastable to x.
    y[:d/2] = x1 cos1 - x2 sin1, y[d/2:] = x2 cos2 + x1 sin2 for x = [x1 | x2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c1, c2, s1, s2 = cos[..., :half], cos[..., half:], sin[..., :half], sin[..., half:]
    return torch.cat([x1 * c1 - x2 * s1, x2 * c2 + x1 * s2], dim=-1)
