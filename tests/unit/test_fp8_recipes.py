"""FP8 linear per recipe (forward, input gradient, weight gradient) against fp64 references.

The reference quantises with the arithmetic written out here (scale = max / amax in fp32, x * scale
clamped to the format's range, cast; the GEMM multiplies by 1 / scale in fp32), then multiplies in fp64.
torch._scaled_mm multiplies FP8 values exactly and sums K products in fp32, then applies two scales:
|error| <= (K + 3) u sum_k |a_k b_k| (u = 2^-24), the bound `_accumulation_bound` checks. Against the
unquantised fp32 linear each element moves by at most its format's half step: 2^-4 |x| (e4m3, 3 mantissa
bits) or 2^-3 |x| (e5m2) in the normal range, half the smallest subnormal (2^-10 or 2^-17) / scale below.
"""
from types import SimpleNamespace

import pytest
import torch

from megatron.core.fp8 import gemm
from megatron.core.fp8.linear import RowBlocks, fp8_linear
from megatron.core.fp8.recipes import build_recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
MAX = {E4M3: 448.0, E5M2: 57344.0}
HALF_STEP = {E4M3: (2.0 ** -4, 2.0 ** -10), E5M2: (2.0 ** -3, 2.0 ** -17)}  # (relative, absolute x scale)
U = 2.0 ** -24


def _settings(recipe, fmt="hybrid", margin=0, history=1, algo="most_recent"):
    return SimpleNamespace(fp8_recipe=recipe, fp8_format=fmt, fp8_margin=margin, fp8_amax_history_len=history,
                           fp8_amax_compute_algo=algo)


def _q_tensor(x, dtype, amax=None):
    """Tensorwise cast written out: (fp64 values of the FP8 tensor, fp64 of the fp32 1/scale, fp32 scale)."""
    a = x.abs().max().float() if amax is None else amax
    s = torch.tensor(MAX[dtype], dtype=torch.float32) / a
    q = (x.float() * s).clamp(-MAX[dtype], MAX[dtype]).to(dtype)
    return q.double(), (1 / s).double(), s


def _q_tiles(x, dtype, rows=1):
    """Blockwise cast written out: tiles of rows x 128 along the last dimension (rows=128: weight blocks).
    Returns (fp64 FP8 values, fp64 per-element 1/scale, fp32 per-element scale)."""
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float64)
    inv = torch.empty(m, k, dtype=torch.float64)
    scale = torch.empty(m, k, dtype=torch.float32)
    for r in range(0, m, rows):
        for c in range(0, k, 128):
            tile = x[r:r + rows, c:c + 128]
            qt, it, st = _q_tensor(tile, dtype)
            q[r:r + rows, c:c + 128], inv[r:r + rows, c:c + 128], scale[r:r + rows, c:c + 128] = qt, it, st
    return q, inv, scale


def _accumulation_bound(a, b):
    """(K + 3) u sum_k |a_ik b_jk| for dequantised fp64 a [M, K], b [N, K]."""
    return 1.01 * (a.shape[1] + 3) * U * (a.abs() @ b.abs().t())


def _case(seed, m=256, k=256, n=128):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.02
    grad = torch.randn(m, n, generator=g) * 1e-3
    return x, w, grad


def _run(recipe, x, w, grad):
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fp8_linear(xr, wr, None, recipe)
    y.backward(grad)
    return y.detach(), xr.grad, wr.grad


def _references(recipe_name, x, w, grad):
    """{gemm: (a, b)} dequantised fp64 operands of forward, dgrad and wgrad as a b^T."""
    if recipe_name == "blockwise":
        qx, ix, _ = _q_tiles(x, E4M3)
        qw, iw, _ = _q_tiles(w, E4M3, rows=128)
        qg, ig, _ = _q_tiles(grad, E5M2)
        qgt, igt, _ = _q_tiles(grad.t().contiguous(), E5M2)
        qxt, ixt, _ = _q_tiles(x.t().contiguous(), E4M3)
        return {"forward": (qx * ix, qw * iw), "dgrad": (qg * ig, (qw * iw).t()), "wgrad": (qgt * igt, qxt * ixt)}
    qx, ix, _ = _q_tensor(x, E4M3)
    qw, iw, _ = _q_tensor(w, E4M3)
    qg, ig, _ = _q_tensor(grad, E5M2)
    return {"forward": (qx * ix, qw * iw), "dgrad": (qg * ig, (qw * iw).t()), "wgrad": ((qg * ig).t(), (qx * ix).t())}


@pytest.mark.parametrize("scaled_mm", [True, False], ids=["scaled_mm", "fp32_mm"])
@pytest.mark.parametrize("name", ["tensorwise", "delayed", "blockwise"])
def test_gemms_equal_fp64_of_the_same_quantised_inputs(name, scaled_mm, monkeypatch):
    """Both GEMM paths: torch._scaled_mm (the GPU's) and the fp32 GEMM of the FP8 values (the CPU's default)."""
    monkeypatch.setattr(gemm, "_use_scaled_mm", lambda a, forced: scaled_mm)
    x, w, grad = _case(0, m=128 if scaled_mm else 256)
    y, dx, dw = _run(build_recipe(_settings(name), (), ()), x, w, grad)
    for which, got in (("forward", y), ("dgrad", dx), ("wgrad", dw)):
        a, b = _references(name, x, w, grad)[which]
        ref = a @ b.t()
        err = (got.double() - ref).abs()
        assert (err <= _accumulation_bound(a, b)).all(), (which, (err - _accumulation_bound(a, b)).max())


def _cast_bound(x, dtype, scale):
    rel, absolute = HALF_STEP[dtype]
    return (rel + 4 * U) * x.abs().double() + absolute / scale.double()


@pytest.mark.parametrize("name", ["tensorwise", "blockwise"])
def test_forward_within_the_cast_bound_of_the_fp32_linear(name):
    x, w, grad = _case(1)
    y, _, _ = _run(build_recipe(_settings(name), (), ()), x, w, grad)
    if name == "blockwise":
        sx, sw = _q_tiles(x, E4M3)[2], _q_tiles(w, E4M3, rows=128)[2]
    else:
        sx, sw = (_q_tensor(t, E4M3)[2].expand_as(t) for t in (x, w))
    dx_, dw_ = _cast_bound(x, E4M3, sx), _cast_bound(w, E4M3, sw)
    xa, wa = x.double().abs(), w.double().abs()
    bound = dx_ @ wa.t() + xa @ dw_.t() + dx_ @ dw_.t() + 2 * _accumulation_bound(x.double(), w.double())
    err = (y.double() - x.double() @ w.double().t()).abs()
    assert (err <= bound).all()
    assert err.max() > 1e-3 * y.abs().max()  # FP8 did change the result (not an fp32 GEMM in disguise)


def test_delayed_scales_from_the_history_and_saturates():
    x, w, grad = _case(2, m=64, k=64, n=32)
    recipe = build_recipe(_settings("delayed", history=3, algo="max"), (), ())
    _run(recipe, x, w, grad)  # step 1: empty history, current scaling
    for s in recipe.delayed_scalers():
        s.update(())
    _run(recipe, 0.5 * x, w, grad)
    for s in recipe.delayed_scalers():
        s.update(())
    x3 = 3 * x  # larger than the history knows: the largest elements saturate at 448
    y, _, dw = _run(recipe, x3, w, grad)
    qx, ix, _ = _q_tensor(x3, E4M3, amax=x.abs().max().float())  # max over the history = step 1's amax
    assert (qx.abs() == 448).sum() > 0
    qw, iw, _ = _q_tensor(w, E4M3)
    a, b = qx * ix, qw * iw
    assert ((y.double() - a @ b.t()).abs() <= _accumulation_bound(a, b)).all()
    qg, ig, _ = _q_tensor(grad, E5M2)
    ref = (qg * ig).t() @ a
    assert ((dw.double() - ref).abs() <= _accumulation_bound((qg * ig).t(), a.t())).all()
    h = recipe.input.amax_history
    assert torch.equal(h, torch.stack([0.5 * x.abs().max(), x.abs().max(), torch.tensor(0.0)]))


def test_most_recent_and_margin():
    x, w, grad = _case(3, m=32, k=32, n=16)
    recipe = build_recipe(_settings("delayed", history=4, margin=2), (), ())
    _run(recipe, x, w, grad)
    for s in recipe.delayed_scalers():
        s.update(())
    _run(recipe, 0.25 * x, w, grad)
    for s in recipe.delayed_scalers():
        s.update(())
    expect = torch.tensor(448.0) / (0.25 * x).abs().max() / 4
    assert torch.equal(recipe.input.scale_, expect)


@pytest.mark.parametrize("name", ["tensorwise", "delayed", "blockwise"])
@pytest.mark.parametrize("fill", [0.0, 1e38, 1e-42])
def test_zero_huge_and_tiny_amax_stay_finite(name, fill):
    x = torch.full((8, 16), fill)
    w = torch.full((4, 16), fill)
    grad = torch.full((8, 4), fill)
    y, dx, dw = _run(build_recipe(_settings(name), (), ()), x, w, grad)
    for t in (y, dx, dw):
        assert not torch.isnan(t).any()
    if fill == 0.0:
        assert not y.any() and not dx.any() and not dw.any()
    if fill == 1e-42:  # scale held at fp32's largest value: finite, and products of tiny values are 0
        assert torch.isfinite(y).all()


def test_bias_and_dtypes_follow_the_inputs():
    """bf16 model weights (fp32 masters live in the optimizer): outputs and gradients in bf16."""
    x, w, grad = _case(4, m=16, k=32, n=8)
    b = torch.randn(8, generator=torch.Generator().manual_seed(5)).bfloat16().requires_grad_()
    xr, wr = x.bfloat16().requires_grad_(), w.bfloat16().requires_grad_()
    y = fp8_linear(xr, wr, b, build_recipe(_settings("tensorwise"), (), ()))
    y.backward(grad.bfloat16())
    assert y.dtype == xr.grad.dtype == wr.grad.dtype == b.grad.dtype == torch.bfloat16
    assert torch.equal(b.grad, grad.bfloat16().sum(0))


@pytest.mark.parametrize("name", ["tensorwise", "delayed"])
def test_pieces_are_cast_apart_as_separate_calls(name):
    """fp8_linear(x, blocks of [3, 0, 9] rows from three micro-batches) (an expert's rows from three source ranks
    under expert parallelism) gives bitwise what three calls give (one process's micro-batches), the weight
    gradients summed in piece order."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(12, 64, generator=g) * torch.tensor([[0.01]] * 3 + [[3.0]] * 9)  # the pieces' amaxes differ
    w, grad = torch.randn(32, 64, generator=g) * 0.1, torch.randn(12, 32, generator=g)

    def run(parts):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        recipe = build_recipe(_settings(name), (), ())
        if parts is None:
            y = torch.cat([fp8_linear(p, ws, None, recipe) for p in xs.split([3, 0, 9])])
            y.backward(grad)
        else:
            y = fp8_linear(xs, ws, None, recipe, RowBlocks(parts, [0, 1, 2], 3))
            y.backward(grad)
        return y.detach(), xs.grad, ws.grad
    apart, joint = run(None), run([3, 0, 9])
    assert all(torch.equal(a, b) for a, b in zip(apart, joint))
    whole = fp8_linear(x, w, None, build_recipe(_settings(name), (), ()))  # one scale for all: another result
    assert not torch.equal(whole, joint[0])


@pytest.mark.parametrize("name", ["tensorwise", "delayed", "blockwise"])
def test_blocks_of_one_micro_batch_apart_are_cast_together(name):
    """An expert's input gathered over expert TP under folding holds each rank's sources in turn, so one
    micro-batch's rows can stand apart (blocks of [3, 5, 2, 4, 0, 2] rows from micro-batches [0, 2, 0, 2, 1, 1]):
    fp8_linear gives bitwise what one call per micro-batch on its rows (in block order) gives, outputs and input
    gradients in the input's order, the weight gradients summed in the order micro-batches first appear; delayed
    scaling records the same step amaxes. Casting each block apart gives another result."""
    sizes, labels = [3, 5, 2, 4, 0, 2], [0, 2, 0, 2, 1, 1]
    g = torch.Generator().manual_seed(5)
    mags = torch.tensor([0.01, 2.0, 1.0, 0.5, 3.0, 7.0]).repeat_interleave(torch.tensor(sizes))
    x = torch.randn(16, 128, generator=g) * mags[:, None]
    w, grad = torch.randn(128, 128, generator=g) * 0.1, torch.randn(16, 128, generator=g)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    rows = {m: torch.cat([torch.arange(a, a + k) for a, k, lab in zip(starts, sizes, labels) if lab == m])
            for m in (0, 2, 1)}

    ref_recipe = build_recipe(_settings(name), (), ())
    y_ref, dx_ref, dw_ref = torch.empty(16, 128), torch.empty(16, 128), None
    for m in (0, 2, 1):
        xs, ws = x[rows[m]].clone().requires_grad_(), w.clone().requires_grad_()
        y = fp8_linear(xs, ws, None, ref_recipe)
        y.backward(grad[rows[m]])
        y_ref[rows[m]], dx_ref[rows[m]] = y.detach(), xs.grad
        dw_ref = ws.grad if dw_ref is None else dw_ref + ws.grad

    def joint(sizes, labels):
        recipe = build_recipe(_settings(name), (), ())
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fp8_linear(xs, ws, None, recipe, RowBlocks(sizes, labels, max(labels) + 1))
        y.backward(grad)
        return (y.detach(), xs.grad, ws.grad), recipe
    got, recipe = joint(sizes, labels)
    assert all(torch.equal(a, b) for a, b in zip(got, (y_ref, dx_ref, dw_ref)))
    if name == "delayed":
        assert all(torch.equal(a.step_amax, b.step_amax) for a, b in zip(recipe.delayed_scalers(),
                                                                           ref_recipe.delayed_scalers()))
    if name != "blockwise":  # blockwise tiles are rows already: only the weight-gradient tiles see the blocks
        apart, _ = joint(sizes, list(range(6)))
        assert not torch.equal(apart[0], got[0])


@pytest.mark.parametrize("name", ["tensorwise", "delayed"])
def test_a_weight_copy_gives_what_the_weights_own_cast_gives(name):
    """--fp8-param-gather: a recipe reading the weight's FP8 copy (cast from the weight with the scale of its amax,
    scale_of_amax) gives bitwise the output and gradients of the recipe casting the weight itself, for two steps
    of delayed scaling (the copy's amax joins the step's, as the forward's cast of the weight adds it); a copy cast
    with another scale gives another output."""
    from megatron.core.distributed.fp8_param_gather import WeightCopy
    from megatron.core.fp8.formats import quantize
    g = torch.Generator().manual_seed(11)
    w = torch.randn(32, 64, generator=g) * 0.1
    plain, copied = build_recipe(_settings(name, history=2), (), ()), build_recipe(_settings(name, history=2), (), ())
    for step in range(2):
        x, grad = torch.randn(8, 64, generator=g), torch.randn(8, 32, generator=g)
        scale = copied.weight_scaler().scale_of_amax(w.abs().amax())
        copied.use_weight_copy(WeightCopy(quantize(w, scale, E4M3), scale.clone()))
        outs = []
        for recipe in (plain, copied):
            xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = fp8_linear(xs, ws, None, recipe)
            y.backward(grad)
            outs.append((y.detach(), xs.grad, ws.grad))
        assert all(torch.equal(a, b) for a, b in zip(*outs)), step
        if name == "delayed":
            assert torch.equal(plain.weight.step_amax, copied.weight.step_amax)
            plain.weight.update(()), copied.weight.update(())
            plain.input.update(()), copied.input.update(())
            plain.grad.update(()), copied.grad.update(())
    copied.use_weight_copy(WeightCopy(quantize(w, scale * 2, E4M3), scale * 2))
    assert not torch.equal(fp8_linear(x, w, None, copied), outs[0][0])
