"""Calls of every fused-kernel binding, valid and invalid, for the bindings tests: on the CPU
test build (tests/unit/test_kernel_bindings.py, tensors on "meta") and on a GPU
(tests/gpu/test_kernel_bindings.py, tensors on "cuda"). A case is a function of the device
(`dev`) returning (binding name, args); `other` is a device the kernels do not take (CPU).

GOOD: one valid call per binding (it must reach its launcher). BAD: {(binding, what): case},
each one bad argument in an otherwise valid call.
"""
import torch

BF = torch.bfloat16
BIG = 2**31  # a last dim past INT_MAX (meta tensors have no memory; on a GPU: a 0-stride expand)


def _t(dev, *shape, dtype=BF):
    return torch.zeros(*shape, dtype=dtype, device=dev)


def _wide(dev, rows, cols, dtype=BF):
    """[rows, cols] with cols > INT_MAX and no memory: contiguous on meta; on a GPU a 0-stride
    view of one element (the size is refused before the layout is looked at)."""
    if dev == "meta":
        return torch.empty(rows, cols, dtype=dtype, device=dev)
    return torch.zeros(1, 1, dtype=dtype, device=dev).expand(rows, cols)


def _noncontig(dev, *shape, dtype=BF):
    return _t(dev, *shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]


def _mask(dev, *shape, dtype=torch.bool):
    return torch.zeros(*shape, dtype=dtype, device=dev)


X4 = (2, 3, 4, 8)


def _norm_fwd(dev, x=None, w=None, b="default", eps=1e-5):
    return "norm_forward", (_t(dev, 6, 8) if x is None else x, _t(dev, 8) if w is None else w,
                            _t(dev, 8) if isinstance(b, str) else b, eps, False)


def _norm_bwd(dev, dy=None, x=None, mean=None, rstd=None, w=None, rms=False, has_bias=True):
    x = _t(dev, 6, 8) if x is None else x
    return "norm_backward", (_t(dev, 6, 8) if dy is None else dy, x,
                             _t(dev, 6, dtype=torch.float32) if mean is None else mean,
                             _t(dev, 6, dtype=torch.float32) if rstd is None else rstd,
                             _t(dev, 8) if w is None else w, rms, has_bias)


MISSING = "missing"  # an argument passed as None where a tensor is required


def _act(name, dev, x=None, b="default", dy=None):
    """(name, args) of a bias_gelu / swiglu binding: x [6, 16], bias [16], dy like the output."""
    missing = isinstance(x, str)
    x = _t(dev, 6, 16) if x is None or missing else x
    b = _t(dev, x.shape[-1], dtype=x.dtype) if isinstance(b, str) else b
    xa = None if missing else x
    if name.endswith("forward"):
        return name, (xa, b)
    f = x.shape[-1] // 2 if name.startswith("swiglu") else x.shape[-1]
    return name, (_t(dev, *x.shape[:-1], f, dtype=x.dtype) if dy is None else dy, xa, b)


def _rope(dev, x=None, cos=None, sin=None):
    x = _t(dev, 5, 2, 3, 8) if x is None else x
    s, d = x.shape[0], x.shape[-1]
    return "rope_apply", (x, _t(dev, s, 1, 1, d) if cos is None else cos, _t(dev, s, 1, 1, d) if sin is None else sin,
                          False)


def _adamw(dev, mains=None, grads=None, ms=None, vs=None, params=None, divisor="default", betas=(0.9, 0.95),
           eps=1e-8):
    """(name, args) of adamw_step: two pieces of 5 and 3 elements, fp32 mains and grads, bf16 moments and
    parameters; the second parameter is its main value (an fp32 model's)."""
    f32 = torch.float32
    mains = [_t(dev, 5, dtype=f32), _t(dev, 3, dtype=f32)] if mains is None else mains
    grads = [_t(dev, 5, dtype=f32), _t(dev, 3, dtype=f32)] if grads is None else grads
    ms = [_t(dev, 5), _t(dev, 3)] if ms is None else ms
    vs = [_t(dev, 5), _t(dev, 3)] if vs is None else vs
    params = [_t(dev, 5, dtype=f32), mains[-1]] if params is None else params
    divisor = _t(dev, 1, dtype=f32) if isinstance(divisor, str) else divisor
    return "adamw_step", (mains, grads, ms, vs, params, divisor, *betas, eps, 1e-3, 1.2, 0.999)


GOOD = {
    "adamw_step": lambda dev: _adamw(dev),
    "softmax_forward": lambda dev: ("softmax_forward", (_t(dev, *X4), _mask(dev, 2, 1, 4, 8), 0.5, False)),
    "softmax_backward": lambda dev: ("softmax_backward", (_t(dev, *X4), _t(dev, *X4), 0.5, True)),
    "norm_forward": lambda dev: _norm_fwd(dev),
    "norm_backward": lambda dev: _norm_bwd(dev),
    "bias_gelu_forward": lambda dev: _act("bias_gelu_forward", dev),
    "bias_gelu_backward": lambda dev: _act("bias_gelu_backward", dev),
    "swiglu_forward": lambda dev: _act("swiglu_forward", dev),
    "swiglu_backward": lambda dev: _act("swiglu_backward", dev),
    "rope_apply": lambda dev: _rope(dev),
}

CPU = "cpu"
F32 = torch.float32
BAD = {
    ("adamw_step", "no tensors"): lambda dev: _adamw(dev, mains=[], grads=[], ms=[], vs=[], params=[]),
    ("adamw_step", "main on the CPU"): lambda dev: _adamw(dev, mains=[_t(CPU, 5, dtype=F32), _t(dev, 3, dtype=F32)]),
    ("adamw_step", "main bf16"): lambda dev: _adamw(dev, mains=[_t(dev, 5), _t(dev, 3)]),
    ("adamw_step", "grads of two dtypes"): lambda dev: _adamw(dev, grads=[_t(dev, 5, dtype=F32), _t(dev, 3)]),
    ("adamw_step", "grad float64"): lambda dev: _adamw(dev, grads=[_t(dev, 5, dtype=torch.float64),
                                                                   _t(dev, 3, dtype=torch.float64)]),
    ("adamw_step", "grad short"): lambda dev: _adamw(dev, grads=[_t(dev, 4, dtype=F32), _t(dev, 3, dtype=F32)]),
    ("adamw_step", "exp_avg 2-D"): lambda dev: _adamw(dev, ms=[_t(dev, 5, 1), _t(dev, 3, 1)]),
    ("adamw_step", "exp_avg_sq strided"): lambda dev: _adamw(dev, vs=[_noncontig(dev, 5), _noncontig(dev, 3)]),
    ("adamw_step", "one exp_avg_sq too few"): lambda dev: _adamw(dev, vs=[_t(dev, 5)]),
    ("adamw_step", "param missing"): lambda dev: _adamw(dev, params=[None, None]),
    ("adamw_step", "divisor fp16"): lambda dev: _adamw(dev, divisor=_t(dev, 1, dtype=torch.float16)),
    ("adamw_step", "divisor of two"): lambda dev: _adamw(dev, divisor=_t(dev, 2, dtype=F32)),
    ("adamw_step", "divisor on the CPU"): lambda dev: _adamw(dev, divisor=_t(CPU, 1, dtype=F32)),
    ("adamw_step", "beta1 1"): lambda dev: _adamw(dev, betas=(1.0, 0.95)),
    ("adamw_step", "beta2 NaN"): lambda dev: _adamw(dev, betas=(0.9, float("nan"))),
    ("adamw_step", "eps 0"): lambda dev: _adamw(dev, eps=0.0),
    # softmax_forward(x, mask, scale, causal)
    ("softmax_forward", "x on the CPU"): lambda dev: ("softmax_forward", (_t(CPU, *X4), None, 1.0, True)),
    ("softmax_forward", "x float64"): lambda dev: ("softmax_forward", (_t(dev, *X4, dtype=torch.float64), None, 1.0,
                                                                       True)),
    ("softmax_forward", "x int"): lambda dev: ("softmax_forward", (_t(dev, *X4, dtype=torch.int32), None, 1.0, True)),
    ("softmax_forward", "x 1-D"): lambda dev: ("softmax_forward", (_t(dev, 8), None, 1.0, True)),
    ("softmax_forward", "x strided"): lambda dev: ("softmax_forward", (_noncontig(dev, *X4), None, 1.0, True)),
    ("softmax_forward", "x rows of 0"): lambda dev: ("softmax_forward", (_t(dev, 2, 3, 4, 0), None, 1.0, True)),
    ("softmax_forward", "x rows past INT_MAX"): lambda dev: ("softmax_forward", (_wide(dev, 1, BIG), None, 1.0, True)),
    ("softmax_forward", "x missing"): lambda dev: ("softmax_forward", (None, None, 1.0, True)),
    ("softmax_forward", "scale NaN"): lambda dev: ("softmax_forward", (_t(dev, *X4), None, float("nan"), True)),
    ("softmax_forward", "mask with causal"): lambda dev: ("softmax_forward", (_t(dev, *X4), _mask(dev, 2, 1, 4, 8), 1.0,
                                                                              True)),
    ("softmax_forward", "mask sq wrong"): lambda dev: ("softmax_forward", (_t(dev, 1, 1, 2, 3), _mask(dev, 1, 1, 3, 3),
                                                                           1.0, False)),
    ("softmax_forward", "mask per head"): lambda dev: ("softmax_forward", (_t(dev, *X4), _mask(dev, 2, 3, 4, 8), 1.0,
                                                                           False)),
    ("softmax_forward", "mask batch wrong"): lambda dev: ("softmax_forward", (_t(dev, *X4), _mask(dev, 3, 1, 4, 8),
                                                                              1.0, False)),
    ("softmax_forward", "mask 3-D"): lambda dev: ("softmax_forward", (_t(dev, *X4), _mask(dev, 2, 4, 8), 1.0, False)),
    ("softmax_forward", "mask float"): lambda dev: ("softmax_forward", (_t(dev, *X4), _mask(dev, 2, 1, 4, 8,
                                                                                             dtype=BF), 1.0, False)),
    ("softmax_forward", "mask on the CPU"): lambda dev: ("softmax_forward", (_t(dev, *X4), _mask(CPU, 2, 1, 4, 8), 1.0,
                                                                             False)),
    ("softmax_forward", "mask strided"): lambda dev: ("softmax_forward", (
        _t(dev, *X4), _mask(dev, 2, 1, 4, 16)[..., ::2], 1.0, False)),
    ("softmax_forward", "mask for 3-D x"): lambda dev: ("softmax_forward", (_t(dev, 3, 4, 8), _mask(dev, 1, 1, 4, 8),
                                                                            1.0, False)),
    # softmax_backward(dy, y, scale, causal)
    ("softmax_backward", "y on the CPU"): lambda dev: ("softmax_backward", (_t(dev, *X4), _t(CPU, *X4), 1.0, False)),
    ("softmax_backward", "dy on the CPU"): lambda dev: ("softmax_backward", (_t(CPU, *X4), _t(dev, *X4), 1.0, False)),
    ("softmax_backward", "dy fp16"): lambda dev: ("softmax_backward", (_t(dev, *X4, dtype=torch.float16), _t(dev, *X4),
                                                                       1.0, False)),
    ("softmax_backward", "dy shape"): lambda dev: ("softmax_backward", (_t(dev, 2, 3, 4, 7), _t(dev, *X4), 1.0, False)),
    ("softmax_backward", "dy strided"): lambda dev: ("softmax_backward", (_noncontig(dev, *X4), _t(dev, *X4), 1.0,
                                                                          False)),
    ("softmax_backward", "y strided"): lambda dev: ("softmax_backward", (_t(dev, *X4), _noncontig(dev, *X4), 1.0,
                                                                         False)),
    ("softmax_backward", "scale inf"): lambda dev: ("softmax_backward", (_t(dev, *X4), _t(dev, *X4), float("inf"),
                                                                         False)),
    ("softmax_backward", "y 1-D"): lambda dev: ("softmax_backward", (_t(dev, 8), _t(dev, 8), 1.0, False)),
    # norm_forward(x, weight, bias, eps, rms)
    ("norm_forward", "x on the CPU"): lambda dev: _norm_fwd(dev, x=_t(CPU, 6, 8)),
    ("norm_forward", "x float64"): lambda dev: _norm_fwd(dev, x=_t(dev, 6, 8, dtype=torch.float64)),
    ("norm_forward", "x strided"): lambda dev: _norm_fwd(dev, x=_noncontig(dev, 6, 8)),
    ("norm_forward", "x 0-D"): lambda dev: _norm_fwd(dev, x=_t(dev)),
    ("norm_forward", "x hidden 0"): lambda dev: _norm_fwd(dev, x=_t(dev, 6, 0), w=_t(dev, 0), b=_t(dev, 0)),
    ("norm_forward", "x hidden past INT_MAX"): lambda dev: _norm_fwd(dev, x=_wide(dev, 1, BIG), w=_wide(dev, 1, BIG)[0],
                                                                     b=None),
    ("norm_forward", "weight on the CPU"): lambda dev: _norm_fwd(dev, w=_t(CPU, 8)),
    ("norm_forward", "weight short"): lambda dev: _norm_fwd(dev, w=_t(dev, 7)),
    ("norm_forward", "weight 2-D"): lambda dev: _norm_fwd(dev, w=_t(dev, 1, 8)),
    ("norm_forward", "weight fp16"): lambda dev: _norm_fwd(dev, w=_t(dev, 8, dtype=torch.float16)),
    ("norm_forward", "weight strided"): lambda dev: _norm_fwd(dev, w=_t(dev, 16)[::2]),
    ("norm_forward", "weight missing"): lambda dev: ("norm_forward", (_t(dev, 6, 8), None, None, 1e-5, False)),
    ("norm_forward", "bias dtype differs"): lambda dev: _norm_fwd(dev, b=_t(dev, 8, dtype=torch.float32)),
    ("norm_forward", "bias short"): lambda dev: _norm_fwd(dev, b=_t(dev, 5)),
    ("norm_forward", "bias for RMSNorm"): lambda dev: ("norm_forward", (_t(dev, 6, 8), _t(dev, 8), _t(dev, 8), 1e-5,
                                                                        True)),
    ("norm_forward", "eps negative"): lambda dev: _norm_fwd(dev, eps=-1.0),
    ("norm_forward", "eps NaN"): lambda dev: _norm_fwd(dev, eps=float("nan")),
    # norm_backward(dy, x, mean, rstd, weight, rms, has_bias)
    ("norm_backward", "dy on the CPU"): lambda dev: _norm_bwd(dev, dy=_t(CPU, 6, 8)),
    ("norm_backward", "dy shape"): lambda dev: _norm_bwd(dev, dy=_t(dev, 6, 4)),
    ("norm_backward", "dy fp32"): lambda dev: _norm_bwd(dev, dy=_t(dev, 6, 8, dtype=torch.float32)),
    ("norm_backward", "dy strided"): lambda dev: _norm_bwd(dev, dy=_noncontig(dev, 6, 8)),
    ("norm_backward", "x strided"): lambda dev: _norm_bwd(dev, x=_noncontig(dev, 6, 8)),
    ("norm_backward", "rstd bf16"): lambda dev: _norm_bwd(dev, rstd=_t(dev, 6)),
    ("norm_backward", "rstd short"): lambda dev: _norm_bwd(dev, rstd=_t(dev, 5, dtype=torch.float32)),
    ("norm_backward", "rstd on the CPU"): lambda dev: _norm_bwd(dev, rstd=_t(CPU, 6, dtype=torch.float32)),
    ("norm_backward", "mean short"): lambda dev: _norm_bwd(dev, mean=_t(dev, 3, dtype=torch.float32)),
    ("norm_backward", "mean 2-D"): lambda dev: _norm_bwd(dev, mean=_t(dev, 6, 1, dtype=torch.float32)),
    ("norm_backward", "weight short"): lambda dev: _norm_bwd(dev, w=_t(dev, 9)),
    ("norm_backward", "weight int"): lambda dev: _norm_bwd(dev, w=_t(dev, 8, dtype=torch.int64)),
    ("norm_backward", "bias with RMSNorm"): lambda dev: _norm_bwd(dev, rms=True, has_bias=True),
    # bias_gelu / swiglu
    **{(name, what): (lambda dev, name=name, kw=kw: _act(name, dev, **kw(dev)))
       for name in ("bias_gelu_forward", "bias_gelu_backward", "swiglu_forward", "swiglu_backward")
       for what, kw in {
           "x on the CPU": lambda dev: dict(x=_t(CPU, 6, 16), b=None),
           "x float64": lambda dev: dict(x=_t(dev, 6, 16, dtype=torch.float64), b=None),
           "x strided": lambda dev: dict(x=_noncontig(dev, 6, 16), b=None),
           "x 0-D": lambda dev: dict(x=_t(dev), b=None),
           "x last dim 0": lambda dev: dict(x=_t(dev, 6, 0), b=None),
           "x last dim past INT_MAX": lambda dev: dict(x=_wide(dev, 1, BIG), b=None),
           "x missing": lambda dev: dict(x=MISSING, b=None),
           "bias on the CPU": lambda dev: dict(b=_t(CPU, 16)),
           "bias short": lambda dev: dict(b=_t(dev, 15)),
           "bias fp32": lambda dev: dict(b=_t(dev, 16, dtype=torch.float32)),
           "bias strided": lambda dev: dict(b=_t(dev, 32)[::2]),
           "bias 2-D": lambda dev: dict(b=_t(dev, 1, 16)),
       }.items()},
    **{(name, what): (lambda dev, name=name, kw=kw: _act(name, dev, **kw(dev)))
       for name in ("bias_gelu_backward", "swiglu_backward")
       for what, kw in {
           "dy on the CPU": lambda dev: dict(dy=_t(CPU, 6, 16)),
           "dy shape": lambda dev: dict(dy=_t(dev, 6, 3)),
           "dy fp16": lambda dev: dict(dy=_t(dev, 6, 16, dtype=torch.float16)),
           "dy strided": lambda dev: dict(dy=_noncontig(dev, 6, 16)),
       }.items()},
    ("swiglu_forward", "x odd last dim"): lambda dev: _act("swiglu_forward", dev, x=_t(dev, 6, 15), b=None),
    ("swiglu_backward", "x odd last dim"): lambda dev: _act("swiglu_backward", dev, x=_t(dev, 6, 15), b=None,
                                                            dy=_t(dev, 6, 7)),
    # rope_apply(x, cos, sin, backward)
    ("rope_apply", "x on the CPU"): lambda dev: _rope(dev, x=_t(CPU, 5, 2, 3, 8)),
    ("rope_apply", "x float64"): lambda dev: _rope(dev, x=_t(dev, 5, 2, 3, 8, dtype=torch.float64)),
    ("rope_apply", "x 3-D"): lambda dev: _rope(dev, x=_t(dev, 5, 6, 8)),
    ("rope_apply", "x odd head dim"): lambda dev: _rope(dev, x=_t(dev, 5, 2, 3, 7)),
    ("rope_apply", "x head dim strided"): lambda dev: _rope(dev, x=_noncontig(dev, 5, 2, 3, 8)),
    ("rope_apply", "x head dim 0"): lambda dev: _rope(dev, x=_t(dev, 5, 2, 3, 0)),
    ("rope_apply", "cos fp32"): lambda dev: _rope(dev, cos=_t(dev, 5, 1, 1, 8, dtype=torch.float32)),
    ("rope_apply", "cos on the CPU"): lambda dev: _rope(dev, cos=_t(CPU, 5, 1, 1, 8)),
    ("rope_apply", "cos short"): lambda dev: _rope(dev, cos=_t(dev, 4, 1, 1, 8)),
    ("rope_apply", "sin partial rotary"): lambda dev: _rope(dev, sin=_t(dev, 5, 1, 1, 4)),
    ("rope_apply", "sin strided"): lambda dev: _rope(dev, sin=_noncontig(dev, 5, 1, 1, 8)),
    ("rope_apply", "sin missing"): lambda dev: ("rope_apply", (_t(dev, 5, 2, 3, 8), _t(dev, 5, 1, 1, 8), None, False)),
}


def run_case(module, case, dev):
    """Call the binding a case names with its arguments on `dev`; returns what the binding returned."""
    name, args = case(dev)
    return getattr(module, name)(*args)
