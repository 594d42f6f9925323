"""Each fused kernel against its torch reference on random odd shapes, forward and backward.

Inputs are random, shapes odd (1-element rows, rows not a multiple of 32, rows longer than
a warp's 32 x 32, batch x heads not a multiple of the 4 rows per block), the memory the
outputs land in is poisoned with NaN first (conftest.poison_cache), and the reference runs
in fp32 from the same (rounded) inputs. Tolerances are per storage dtype: the kernels do fp32
math and round once, the references round the same way or later.
"""
import pytest
import torch
import torch.nn.functional as F

from megatron.core.fusions import activations, norm, rope, softmax
from megatron.core.transformer.rope import rope_cos_sin
from tests.gpu.conftest import poison_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


def _rand(*shape, dtype, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _run(fn, inputs, grad):
    """fn(*inputs) and the grads of every input that requires grad, outputs fresh from a poisoned cache."""
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) if torch.is_tensor(t) else t for t in inputs]
    poison_cache()
    out = fn(*leaves)
    poison_cache()
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves if torch.is_tensor(t) and t.requires_grad]


def _check(fused, ref, dtype, what):
    (o1, g1), (o2, g2) = fused, ref
    assert torch.isfinite(o1).all() == torch.isfinite(o2).all(), f"{what}: non-finite output (unwritten memory?)"
    torch.testing.assert_close(o1.float(), o2.float(), **TOL[dtype], msg=lambda m: f"{what} output: {m}")
    for i, (a, e) in enumerate(zip(g1, g2)):
        assert a is not None and torch.isfinite(a).all(), f"{what}: grad {i} missing or non-finite"
        torch.testing.assert_close(a.float(), e.float(), **TOL[dtype], msg=lambda m: f"{what} grad {i}: {m}")


def _upcast(fn):
    """The torch reference in fp32 from the same rounded inputs, cast back to the input dtype."""
    def run(*args):
        dtype = next(a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point())
        return fn(*(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)).to(dtype)
    return run


SOFTMAX_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (3, 5, 37, 37), (1, 2, 129, 1000), (2, 1, 17, 3000),
                  (1, 1, 3, 8193), (1, 7, 64, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_masked_softmax(ext, dtype, shape):
    b, h, sq, sk = shape
    x = _rand(*shape, dtype=dtype, seed=sum(shape), scale=3.0).requires_grad_()
    grad = _rand(*shape, dtype=dtype, seed=1)
    for mb in {1, b}:
        g = torch.Generator(device="cuda").manual_seed(7)
        mask = torch.rand(mb, 1, sq, sk, device="cuda", generator=g) < 0.3
        mask[0, 0, 0] = True  # one fully masked row: zeros, not NaN
        fused = _run(lambda t: softmax.scaled_masked_softmax(t, mask, 0.7, "csrc"), [x], grad)
        ref = _run(_upcast(lambda t: softmax.torch_scaled_masked_softmax(t, mask, 0.7)), [x], grad)
        _check(fused, ref, dtype, f"masked softmax {shape} mask batch {mb}")
        assert (fused[0][0, :, 0] == 0).all(), "a fully masked row must be zeros"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES + [(2, 3, 9, 4), (2, 3, 4, 9)], ids=str)
def test_causal_softmax(ext, dtype, shape):
    x = _rand(*shape, dtype=dtype, seed=sum(shape) + 1, scale=3.0).requires_grad_()
    grad = _rand(*shape, dtype=dtype, seed=2)
    fused = _run(lambda t: softmax.scaled_upper_triang_masked_softmax(t, 0.5, "csrc"), [x], grad)
    ref = _run(_upcast(lambda t: softmax.torch_scaled_masked_softmax(t, None, 0.5, causal=True)), [x], grad)
    _check(fused, ref, dtype, f"causal softmax {shape}")
    above = torch.ones(shape[-2:], dtype=torch.bool, device="cuda").triu(1)
    assert (fused[0][..., above] == 0).all(), "entries above the diagonal must be exactly zero"


NORM_SHAPES = [(1, 1), (7, 33), (129, 1000), (1024, 4096), (3, 12288), (2, 5, 64)]


@pytest.mark.parametrize("wdtype", ["same", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
def test_norms(ext, dtype, wdtype, shape):
    h = shape[-1]
    wt = dtype if wdtype == "same" else torch.float32
    x = _rand(*shape, dtype=dtype, seed=h, scale=2.0).add_(0.5).requires_grad_()
    w = _rand(h, dtype=wt, seed=3).add_(1.0).requires_grad_()
    b = _rand(h, dtype=wt, seed=4).requires_grad_()
    grad = _rand(*shape, dtype=dtype, seed=5)
    tol_dtype = dtype
    fused = _run(lambda *t: norm.layer_norm(*t, 1e-5, "csrc"), [x, w, b], grad)
    ref = _run(lambda x_, w_, b_: F.layer_norm(x_.float(), (h,), w_.float(), b_.float(), 1e-5).to(dtype),
               [x, w, b], grad)
    _check(fused, ref, tol_dtype, f"LayerNorm {shape} weights {wdtype}")
    fused = _run(lambda *t: norm.rms_norm(*t, 1e-5, "csrc"), [x, w], grad)
    ref = _run(lambda x_, w_: norm.torch_rms_norm(x_.float(), w_.float(), 1e-5).to(dtype), [x, w], grad)
    _check(fused, ref, tol_dtype, f"RMSNorm {shape} weights {wdtype}")


ACT_SHAPES = [(1, 2), (5, 7 * 2), (33, 1001 * 2), (4096, 2 * 2816), (2, 3, 130)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ACT_SHAPES, ids=str)
def test_bias_gelu_and_swiglu(ext, dtype, shape, bias):
    x = _rand(*shape, dtype=dtype, seed=shape[-1], scale=2.0).requires_grad_()
    b = _rand(shape[-1], dtype=dtype, seed=6).requires_grad_() if bias else None
    inputs = [x, b] if bias else [x]
    grad = _rand(*shape, dtype=dtype, seed=7)
    fused = _run(lambda *t: activations.bias_gelu(*t, impl="csrc"), inputs, grad)
    ref = _run(_upcast(activations.torch_bias_gelu), inputs, grad)
    _check(fused, ref, dtype, f"bias-gelu {shape}")
    grad = _rand(*shape[:-1], shape[-1] // 2, dtype=dtype, seed=8)
    fused = _run(lambda *t: activations.bias_swiglu(*t, impl="csrc"), inputs, grad)
    ref = _run(_upcast(activations.torch_bias_swiglu), inputs, grad)
    _check(fused, ref, dtype, f"swiglu {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (7, 3, 5, 8), (129, 2, 3, 64), (2048, 1, 4, 128)], ids=str)
def test_rope(ext, dtype, shape):
    s, b, h, d = shape
    qkv = _rand(s, b, h, 3 * d, dtype=dtype, seed=s + d)
    x = qkv[..., :d].requires_grad_()  # a non-contiguous view, as q is in attention
    cos, sin = rope_cos_sin(s, d, 10000, "cuda", dtype)
    grad = _rand(s, b, h, d, dtype=dtype, seed=9)
    fused = _run(lambda t: rope.apply_rope(t, cos, sin, "csrc"), [x], grad)
    ref = _run(_upcast(lambda t: rope.torch_apply_rope(t, cos.float(), sin.float())), [x], grad)
    _check(fused, ref, dtype, f"rope {shape}")


def test_errors_are_python_exceptions(ext):
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        ext.softmax_forward(torch.zeros(2, 2), None, 1.0, True)
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        ext.bias_gelu_forward(torch.zeros(2, 2, dtype=torch.float64, device="cuda"), None)
    with pytest.raises(RuntimeError, match="mask must be"):
        ext.softmax_forward(torch.zeros(1, 1, 2, 3, device="cuda"), torch.zeros(1, 1, 3, 3, dtype=torch.bool,
                                                                                  device="cuda"), 1.0, False)
