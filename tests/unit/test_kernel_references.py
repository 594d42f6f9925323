"""The GPU tests' written-out references (tests/gpu/references.py) equal torch's functions in
float64, forward and backward, on CPU: so a GPU failure is the kernel's, not the reference's."""
import pytest
import torch
import torch.nn.functional as F

from tests.gpu import references as ref

DT = torch.float64


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def _same(fn_ref, fn_torch, *inputs, seed=0):
    """Outputs and the gradients of <output, random> wrt every input agree to float64 rounding."""
    outs = []
    for fn in (fn_ref, fn_torch):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        y = fn(*leaves)
        y.backward(_rand(*y.shape, seed=seed))
        outs.append((y.detach(), [t.grad for t in leaves]))
    (y1, g1), (y2, g2) = outs
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-13)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _torch_masked_softmax(x, scale, masked):
    return torch.softmax((x * scale).masked_fill(masked, float("-inf")), dim=-1)


@pytest.mark.parametrize("mask_shape", [(2, 1, 5, 7), (1, 1, 5, 7), (2, 1, 1, 7), (2, 3, 5, 7)])
def test_masked_softmax(mask_shape):
    x = _rand(2, 3, 5, 7, seed=1) * 3
    mask = torch.rand(*mask_shape, generator=torch.Generator().manual_seed(2)) < 0.4
    mask[..., 0] = False  # no empty row here: torch gives NaN there (checked below)
    _same(lambda t: ref.masked_softmax(t, 0.7, mask), lambda t: _torch_masked_softmax(t, 0.7, mask), x)


def test_fully_masked_rows_are_zero_with_zero_gradient():
    x = _rand(2, 3, 5, 7, seed=3).requires_grad_()
    mask = torch.zeros(2, 1, 5, 7, dtype=torch.bool)
    mask[1, 0, 2] = True
    y = ref.masked_softmax(x, 0.5, mask)
    y.backward(_rand(*y.shape, seed=4))
    assert torch.equal(y[1, :, 2], torch.zeros_like(y[1, :, 2]))
    assert torch.isfinite(x.grad).all() and torch.equal(x.grad[1, :, 2], torch.zeros_like(x.grad[1, :, 2]))
    torch.testing.assert_close(y[0], torch.softmax(x[0] * 0.5, -1), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("sq,sk", [(5, 5), (4, 9), (9, 4)])
def test_causal_softmax(sq, sk):
    x = _rand(2, 3, sq, sk, seed=5) * 3
    above = torch.ones(sq, sk, dtype=torch.bool).triu(1)  # top-left aligned, as SDPA's is_causal
    if sq > sk:  # rows past the last column keep every column: still no empty row
        assert not above.all(-1).any()
    _same(lambda t: ref.masked_softmax(t, 0.5, causal=True), lambda t: _torch_masked_softmax(t, 0.5, above), x)


def test_layer_norm():
    x, w, b = _rand(3, 4, 33, seed=6) * 2 + 0.5, _rand(33, seed=7) + 1, _rand(33, seed=8)
    _same(lambda *t: ref.layer_norm(*t, 1e-5), lambda x_, w_, b_: F.layer_norm(x_, (33,), w_, b_, 1e-5), x, w, b)


def test_rms_norm():
    x, w = _rand(3, 4, 33, seed=9) * 2 + 0.5, _rand(33, seed=10) + 1
    _same(lambda *t: ref.rms_norm(*t, 1e-5), lambda x_, w_: F.rms_norm(x_, (33,), w_, 1e-5), x, w)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu(approximate):
    x, b = _rand(5, 14, seed=11) * 3, _rand(14, seed=12)
    _same(lambda *t: ref.bias_gelu(*t, approximate), lambda x_, b_: F.gelu(x_ + b_, approximate=approximate), x, b)
    _same(lambda t: ref.bias_gelu(t, None, approximate), lambda t: F.gelu(t, approximate=approximate), x)


def test_bias_swiglu():
    x, b = _rand(5, 3, 14, seed=13) * 3, _rand(14, seed=14)
    _same(ref.bias_swiglu, lambda x_, b_: F.silu((x_ + b_)[..., :7]) * (x_ + b_)[..., 7:], x, b)


def test_rope_is_a_rotation_of_each_pair():
    """Equal halves of cos / sin (angles theta): pair (x_i, x_{i + d/2}) times e^{i theta}, as complex numbers."""
    s, d = 6, 8
    theta = _rand(s, 1, 1, d // 2, seed=15)
    cos, sin = torch.cos(theta).repeat(1, 1, 1, 2), torch.sin(theta).repeat(1, 1, 1, 2)

    def complex_rotation(x):
        z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(torch.ones_like(theta), theta)
        return torch.cat([z.real, z.imag], dim=-1)
    _same(lambda t: ref.rope(t, cos, sin), complex_rotation, _rand(s, 2, 3, d, seed=16))


def test_rope_with_unequal_halves_is_the_block_matrix():
    """cos / sin halves that differ: y = [[C1, -S1], [S2, C2]] x per position, as an explicit matrix."""
    s, d = 5, 6
    cos, sin = _rand(s, 1, 1, d, seed=17), _rand(s, 1, 1, d, seed=18)
    h = d // 2
    m = torch.zeros(s, d, d, dtype=DT)
    idx = torch.arange(h)
    m[:, idx, idx] = cos[:, 0, 0, :h]
    m[:, idx, idx + h] = -sin[:, 0, 0, :h]
    m[:, idx + h, idx + h] = cos[:, 0, 0, h:]
    m[:, idx + h, idx] = sin[:, 0, 0, h:]
    _same(lambda t: ref.rope(t, cos, sin), lambda t: torch.einsum("sij,sbhj->sbhi", m, t), _rand(s, 2, 3, d, seed=19))
