"""megatron_fused_kernels in torch, for the fronts' kernel path on CPU (tests/unit/test_fusions.py).

Every binding of csrc/fused is implemented with the closed-form backward formulas the .cu files
use (not autograd), so the autograd wrappers (what they save, argument order, the bias
gradients the kernels now return) and the kernels' derivations are checked against torch
autograd in float64. Each call is recorded (`calls`), and each asserts what its binding checks
of the fronts' tensors (layout, shapes), so a test can fail when the front ran torch instead
of the kernel or handed it something the binding would refuse. fp32 math on fp32 storage
becomes fp64 here: the checks are about formulas and routing, not rounding.
"""
import math

import torch


class FakeKernels:
    def __init__(self):
        self.calls = []

    def called(self):
        return {name for name, *_ in self.calls}

    def softmax_forward(self, x, mask, scale, causal):
        self.calls.append(("softmax_forward", x.shape, None if mask is None else mask.shape))
        assert x.is_contiguous() and x.dim() >= 2
        sq, sk = x.shape[-2:]
        masked = torch.ones(sq, sk, dtype=torch.bool).triu(1) if causal else mask
        v = (x * scale).masked_fill(masked, float("-inf")) if masked is not None else x * scale
        m = v.amax(-1, keepdim=True)
        e = torch.exp(v - torch.where(torch.isinf(m), torch.zeros_like(m), m))
        d = e.sum(-1, keepdim=True)
        return torch.where(d == 0, torch.zeros_like(e), e / d)

    def softmax_backward(self, dy, y, scale, causal=False):
        self.calls.append(("softmax_backward", y.shape, causal))
        assert dy.is_contiguous() and dy.shape == y.shape
        return scale * y * (dy - (dy * y).sum(-1, keepdim=True))

    def norm_forward(self, x, weight, bias, eps, rms):
        self.calls.append(("norm_forward", x.shape, rms))
        assert x.is_contiguous() and weight.shape == x.shape[-1:] and (bias is None or not rms)
        mu = torch.zeros_like(x[..., :1]) if rms else x.mean(-1, keepdim=True)
        r = torch.rsqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
        y = (x - mu) * r * weight + (bias if bias is not None else 0)
        return y, (mu.flatten() if not rms else x.new_empty(0)), r.flatten()

    def norm_backward(self, dy, x, mean, rstd, weight, rms, has_bias):
        self.calls.append(("norm_backward", x.shape, rms))
        assert dy.is_contiguous() and dy.shape == x.shape and not (rms and has_bias)
        n = x.shape[-1]
        mu = 0 if rms else mean.view(*x.shape[:-1], 1)
        r = rstd.view(*x.shape[:-1], 1)
        xh = (x - mu) * r
        g = dy * weight
        v = g - xh * (g * xh).sum(-1, keepdim=True) / n
        if not rms:
            v = v - g.sum(-1, keepdim=True) / n

        def flat(t):
            return t.reshape(-1, n)

        return r * v, flat(dy * xh).sum(0), (flat(dy).sum(0) if has_bias and not rms else None)

    @staticmethod
    def _gelu_grad(v):
        return 0.5 * (1 + torch.erf(v / math.sqrt(2))) + v * torch.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)

    @staticmethod
    def _bias_sum(dx, bias):
        """The bias gradient the backward kernels sum in their pass (None without a bias)."""
        return None if bias is None else dx.reshape(-1, dx.shape[-1]).sum(0)

    def _check(self, x, bias):
        assert x.is_contiguous() and (bias is None or (bias.shape == x.shape[-1:] and bias.dtype == x.dtype))

    def bias_gelu_forward(self, x, bias):
        self.calls.append(("bias_gelu_forward", x.shape, bias is not None))
        self._check(x, bias)
        v = x + bias if bias is not None else x
        return 0.5 * v * (1 + torch.erf(v / math.sqrt(2)))

    def bias_gelu_backward(self, dy, x, bias):
        self.calls.append(("bias_gelu_backward", x.shape, bias is not None))
        self._check(x, bias)
        assert dy.is_contiguous() and dy.shape == x.shape
        dx = dy * self._gelu_grad(x + bias if bias is not None else x)
        return dx, self._bias_sum(dx, bias)

    def swiglu_forward(self, x, bias):
        self.calls.append(("swiglu_forward", x.shape, bias is not None))
        self._check(x, bias)
        g, u = (x + bias if bias is not None else x).chunk(2, -1)
        return g * torch.sigmoid(g) * u

    def swiglu_backward(self, dy, x, bias):
        self.calls.append(("swiglu_backward", x.shape, bias is not None))
        self._check(x, bias)
        assert dy.is_contiguous() and dy.shape == x.shape[:-1] + (x.shape[-1] // 2,)
        g, u = (x + bias if bias is not None else x).chunk(2, -1)
        s = torch.sigmoid(g)
        dx = torch.cat([dy * u * s * (1 + g * (1 - s)), dy * g * s], dim=-1)
        return dx, self._bias_sum(dx, bias)

    def rope_apply(self, x, cos, sin, backward):
        self.calls.append(("rope_apply", x.shape, backward, x.is_contiguous()))
        assert x.dim() == 4 and x.stride(-1) == 1, "the binding takes [s, b, h, d] with a contiguous last dim"
        assert cos.is_contiguous() and sin.is_contiguous() and cos.numel() == x.shape[0] * x.shape[-1]
        d = x.shape[-1]
        half = d // 2
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d,)
        c, s = cos.reshape(shape), sin.reshape(shape)
        partner = torch.cat([x[..., half:], x[..., :half]], dim=-1)
        sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(x.dtype)
        if not backward:
            return x * c + sign * partner * s
        s_partner = torch.cat([s[..., half:], s[..., :half]], dim=-1)
        return x * c - sign * partner * s_partner
