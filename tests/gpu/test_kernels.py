"""Each fused kernel against the math written out in float64 (tests/gpu/references.py), on random
odd shapes, forward and backward.

Shapes are odd (1-element rows, rows not a multiple of 32, rows longer than a warp's 32 x 32,
batch x heads not a multiple of the 4 rows per block) and reach every path of each kernel: the
16-byte vector path (row lengths a multiple of 8 elements), its scalar fallback (odd lengths,
and `misaligned` inputs: contiguous views that start 2 bytes past a 16-byte boundary), rows
longer than the register tile (the general path), and more rows than one wave of the
persistent grid (so partial sums add over several rows per slot); every free block of the caching
allocator, small pool included, is poisoned with NaN before the forward and before the backward
(conftest.poison_cache), so an output element a kernel leaves unwritten fails; inputs keep their
layout (a strided view stays one). The references are not our fronts' torch fallbacks: they run
in float64 from the same rounded inputs and are rounded once to the storage dtype, as the
kernels' fp32 math is. Each fused run must have gone through our kernel (_CsrcXxx in its graph).
"""
import pytest
import torch

from megatron.core.fusions import activations, norm, rope, softmax
from megatron.core.transformer.rope import rope_cos_sin
from tests.gpu import references as ref
from tests.gpu.conftest import poison_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}
REF = torch.float64


def _rand(*shape, dtype, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _leaf(t):
    """A fresh leaf with t's values and strides (clone() would make a strided view contiguous),
    and t's misalignment: a view that starts as many bytes past a 16-byte boundary as t does."""
    if not torch.is_tensor(t):
        return t
    offset = (t.data_ptr() % 16) // t.element_size()
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
    base = torch.empty(span + offset, dtype=t.dtype, device=t.device)
    out = base.as_strided(t.shape, t.stride(), offset)
    return out.copy_(t.detach()).requires_grad_(t.requires_grad)


def _misaligned(t):
    """t's values in a contiguous view that starts one element (2 or 4 bytes) past a 16-byte boundary."""
    base = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = base[1:].view(t.shape).copy_(t.detach())
    assert out.data_ptr() % 16 != 0
    return out.requires_grad_(t.requires_grad)


def _through_kernel(out):
    """True when one of our kernels' autograd functions (_Csrc*) made `out` (a few views deep)."""
    nodes, seen = [out.grad_fn], 0
    while nodes and seen < 64:
        node = nodes.pop()
        seen += 1
        if node is not None:
            if type(node).__name__.startswith("_Csrc"):
                return True
            nodes.extend(f for f, _ in node.next_functions)
    return False


def _fused(fn, inputs, grad, kernel=True):
    """fn(*inputs) and the grads of every input that requires grad, outputs fresh from poisoned memory."""
    leaves = [_leaf(t) for t in inputs]
    poison_cache()
    out = fn(*leaves)
    assert _through_kernel(out) == kernel, "the fused kernel was not called" if kernel else "a kernel was called"
    poison_cache()
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves if torch.is_tensor(t) and t.requires_grad]


def _reference(fn, inputs, grad):
    """fn on float64 copies of the same rounded inputs; the output and grads rounded once to their dtypes."""
    leaves = [t.detach().to(REF).requires_grad_(t.requires_grad) if torch.is_tensor(t) else t for t in inputs]
    out = fn(*leaves)
    out.backward(grad.to(REF))
    grads = [t.grad.to(o.dtype) for t, o in zip(leaves, inputs) if torch.is_tensor(t) and t.requires_grad]
    return out.detach().to(grad.dtype), grads


def _check(fused, reference, dtype, what):
    (o1, g1), (o2, g2) = fused, reference
    assert torch.isfinite(o1).all(), f"{what}: non-finite output (memory the kernel did not write?)"
    torch.testing.assert_close(o1.float(), o2.float(), **TOL[dtype], msg=lambda m: f"{what} output: {m}")
    assert len(g1) == len(g2)
    for i, (a, e) in enumerate(zip(g1, g2)):
        assert a is not None and torch.isfinite(a).all(), f"{what}: grad {i} missing or non-finite"
        # a bias gradient sums rows the front rounded first: near-zero sums get an absolute
        # tolerance that scales with the largest entry (a wrong formula is off by the entries' size)
        atol = TOL[dtype]["atol"] * max(1.0, e.abs().max().item() if e.numel() else 1.0)
        torch.testing.assert_close(a.float(), e.float(), rtol=TOL[dtype]["rtol"], atol=atol,
                                   msg=lambda m: f"{what} grad {i}: {m}")


@pytest.mark.parametrize("numel", [1, 7, 1000, 100_000, 3_000_000])
def test_poison_reaches_small_and_large_allocations(numel):
    live = torch.zeros(numel, device="cuda")  # a live block beside the free ones, in the same pool
    del live
    kept = torch.zeros(3, device="cuda")
    poison_cache()
    for dtype in DTYPES:
        assert torch.isnan(torch.empty(numel, dtype=dtype, device="cuda")).all(), (numel, dtype)
    assert torch.equal(kept, torch.zeros_like(kept)), "live tensors must keep their values"


# vector path: sk a multiple of 8 up to 16384; scalar: odd sk; general: sk > 16384; many rows: (8, 4, 64, 256)
SOFTMAX_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (3, 5, 37, 37), (1, 2, 129, 1000), (2, 1, 17, 3000),
                  (1, 1, 3, 8193), (1, 7, 64, 64), (1, 1, 2, 16384), (1, 1, 2, 16392), (8, 4, 64, 256)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_masked_softmax(ext, dtype, shape):
    b, h, sq, sk = shape
    x = _rand(*shape, dtype=dtype, seed=sum(shape), scale=3.0).requires_grad_()
    grad = _rand(*shape, dtype=dtype, seed=1)
    # [b or 1, 1, sq, sk]; a padding mask [b, 1, 1, sk] and one per head, which the front reshapes
    for mask_shape in {(1, 1, sq, sk), (b, 1, sq, sk), (b, 1, 1, sk), (b, h, sq, sk)}:
        g = torch.Generator(device="cuda").manual_seed(7)
        mask = torch.rand(*mask_shape, device="cuda", generator=g) < 0.3
        mask[0, 0, 0] = True  # a fully masked row (a padding mask: every row of batch 0): zeros, not NaN
        fused = _fused(lambda t, m=mask: softmax.scaled_masked_softmax(t, m, 0.7, "csrc"), [x], grad)
        reference = _reference(lambda t, m=mask: ref.masked_softmax(t, 0.7, m), [x], grad)
        _check(fused, reference, dtype, f"masked softmax {shape} mask {mask_shape}")
        assert (fused[0][mask.expand(shape)] == 0).all(), "masked entries must be exactly zero"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES + [(2, 3, 9, 4), (2, 3, 4, 9)], ids=str)
def test_causal_softmax(ext, dtype, shape, misaligned=False):
    x = _rand(*shape, dtype=dtype, seed=sum(shape) + 1, scale=3.0).requires_grad_()
    if misaligned:
        x = _misaligned(x)
    grad = _rand(*shape, dtype=dtype, seed=2)
    fused = _fused(lambda t: softmax.scaled_upper_triang_masked_softmax(t, 0.5, "csrc"), [x], grad)
    reference = _reference(lambda t: ref.masked_softmax(t, 0.5, causal=True), [x], grad)
    _check(fused, reference, dtype, f"causal softmax {shape}")
    above = torch.ones(shape[-2:], dtype=torch.bool, device="cuda").triu(1)
    assert (fused[0][..., above] == 0).all(), "entries above the diagonal must be exactly zero"


# vector path: h a multiple of 8 up to 8192 ((4096, 2048): several rows per slot of the persistent grid);
# scalar: odd h; general: h > 8192
NORM_SHAPES = [(1, 1), (7, 33), (129, 1000), (1024, 4096), (3, 12288), (2, 5, 64), (17, 8192), (9, 8200),
               (4096, 2048)]


@pytest.mark.parametrize("wdtype", ["same", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
def test_norms(ext, dtype, wdtype, shape, misaligned=False):
    h = shape[-1]
    wt = dtype if wdtype == "same" else torch.float32
    x = _rand(*shape, dtype=dtype, seed=h, scale=2.0).add_(0.5).requires_grad_()
    if misaligned:
        x = _misaligned(x)
    w = _rand(h, dtype=wt, seed=3).add_(1.0).requires_grad_()
    b = _rand(h, dtype=wt, seed=4).requires_grad_()
    grad = _rand(*shape, dtype=dtype, seed=5)
    fused = _fused(lambda *t: norm.layer_norm(*t, 1e-5, "csrc"), [x, w, b], grad)
    reference = _reference(lambda *t: ref.layer_norm(*t, 1e-5), [x, w, b], grad)
    _check(fused, reference, dtype, f"LayerNorm {shape} weights {wdtype}")
    fused = _fused(lambda *t: norm.rms_norm(*t, 1e-5, "csrc"), [x, w], grad)
    reference = _reference(lambda *t: ref.rms_norm(*t, 1e-5), [x, w], grad)
    _check(fused, reference, dtype, f"RMSNorm {shape} weights {wdtype}")


# vector path: last dim (and half of it) a multiple of 8; (4096, 2 * 2816) and (3000, 2 * 520): more rows
# than one wave of the grid; scalar: (33, 1001 * 2), (2, 3, 130) and misaligned inputs
ACT_SHAPES = [(1, 2), (5, 7 * 2), (33, 1001 * 2), (4096, 2 * 2816), (2, 3, 130), (3000, 2 * 520)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ACT_SHAPES, ids=str)
def test_bias_gelu_and_swiglu(ext, dtype, shape, bias, misaligned=False):
    x = _rand(*shape, dtype=dtype, seed=shape[-1], scale=2.0).requires_grad_()
    if misaligned:
        x = _misaligned(x)
    b = _rand(shape[-1], dtype=dtype, seed=6).requires_grad_() if bias else None
    inputs = [x, b] if bias else [x]
    grad = _rand(*shape, dtype=dtype, seed=7)
    fused = _fused(lambda *t: activations.bias_gelu(*t, impl="csrc"), inputs, grad)
    _check(fused, _reference(ref.bias_gelu, inputs, grad), dtype, f"bias-gelu {shape}")
    # the tanh form (--openai-gelu) has no kernel: the front must run torch, and get it right
    fused = _fused(lambda *t: activations.bias_gelu(*t, impl="csrc", approximate="tanh"), inputs, grad, kernel=False)
    reference = _reference(lambda *t: ref.bias_gelu(*t, approximate="tanh"), inputs, grad)
    _check(fused, reference, dtype, f"bias-gelu tanh {shape}")
    grad = _rand(*shape[:-1], shape[-1] // 2, dtype=dtype, seed=8)
    fused = _fused(lambda *t: activations.bias_swiglu(*t, impl="csrc"), inputs, grad)
    _check(fused, _reference(ref.bias_swiglu, inputs, grad), dtype, f"swiglu {shape}")


@pytest.mark.parametrize("start", [0, 1], ids=["q", "misaligned"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 2, 2), (7, 3, 5, 8), (129, 2, 3, 64), (2048, 1, 4, 128)], ids=str)
def test_rope(ext, dtype, shape, start):
    s, b, h, d = shape
    qkv = _rand(s, b, h, 3 * d + start, dtype=dtype, seed=s + d)
    # q as attention slices it from the fused qkv projection (start 1: a view 1 element off 16 bytes)
    x = qkv[..., start:start + d].requires_grad_()
    assert not x.is_contiguous() and not _leaf(x).is_contiguous()
    cos, sin = rope_cos_sin(s, d, 10000, "cuda", dtype)
    grad = _rand(s, b, h, d, dtype=dtype, seed=9)

    def fused_rope(t):
        assert not t.is_contiguous(), "the front must get the strided view itself"
        return rope.apply_rope(t, cos, sin, "csrc")
    fused = _fused(fused_rope, [x], grad)
    reference = _reference(lambda t: ref.rope(t, cos.to(REF), sin.to(REF)), [x], grad)
    _check(fused, reference, dtype, f"rope {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_inputs(ext, dtype):
    """Contiguous inputs that start one element past a 16-byte boundary, at row lengths the vector
    path would take: every kernel falls back to its scalar path and computes the same."""
    for shape in [(3, 5, 64), (129, 1000)]:
        test_norms(ext, dtype, "same", shape, misaligned=True)
    for shape in [(1, 2, 17, 3000), (8, 4, 64, 256)]:
        test_causal_softmax(ext, dtype, shape, misaligned=True)
    for shape in [(3000, 2 * 520), (5, 7 * 2)]:
        test_bias_gelu_and_swiglu(ext, dtype, shape, bias=True, misaligned=True)
