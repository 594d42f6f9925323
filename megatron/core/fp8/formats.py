"""FP8 formats, scales from amaxes, and the saturating cast.

A scale s maps a tensor into the format's range: q = cast(clamp(x * s, -max, max)); the GEMM multiplies by
1 / s again (torch._scaled_mm's scale arguments are these inverses). s = max / amax / 2^margin, so the
largest element lands on the format's largest value (or 2^margin below it).
"""
import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
_FP32_MAX = torch.finfo(torch.float32).max


def formats(name: str):
    """(forward dtype, gradient dtype) of --fp8-format: e4m3 everywhere, or hybrid (e5m2 gradients: their
    range matters more than their precision)."""
    if name == "e4m3":
        return E4M3, E4M3
    if name == "hybrid":
        return E4M3, E5M2
    raise ValueError(f"unknown FP8 format {name!r} (e4m3 or hybrid)")


def scale_from_amax(amax: torch.Tensor, dtype, margin: int = 0) -> torch.Tensor:
    """fp32 scales (amax's shape) for amaxes `amax`. An amax of 0, inf or NaN says nothing about the range:
    scale 1 (as Transformer Engine keeps the previous one). A tiny amax would give an infinite scale: it is
    held at fp32's largest finite value (x * s stays finite since |x| <= amax)."""
    a = amax.float()
    usable = (a > 0) & torch.isfinite(a)
    # a tensor numerator: python-number / tensor is reciprocal-then-multiply in torch (another rounding)
    s = torch.where(usable, torch.full_like(a, FP8_MAX[dtype]) / torch.where(usable, a, 1.0), 1.0)
    if margin:
        s = torch.where(usable, s / 2.0 ** margin, s)
    return s.clamp(max=_FP32_MAX)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    """Saturating cast of x * scale to `dtype` (scale broadcasts against x). torch's cast to e4m3fn turns
    an out-of-range value into NaN, so the clamp is what saturates."""
    m = FP8_MAX[dtype]
    return (x.float() * scale).clamp(-m, m).to(dtype)


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a 0-d fp32 tensor (0 for an empty x)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.detach().abs().amax().float()
