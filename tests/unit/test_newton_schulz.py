"""Muon's pieces on one process: Newton-Schulz against an fp64 reference written out here, the update
scales, the coefficient rules, and the split of a fused GQA QKV weight into Q, K and V."""
import types

import pytest
import torch
from torch import nn

from megatron.core.optimizer.muon import MuonConfig
from megatron.core.optimizer.muon_matrix import ns_cost, orthogonalize, parts
from megatron.core.optimizer.newton_schulz import coefficient_schedule, newton_schulz, scale_factor
from megatron.core.tensor_parallel.param_meta import set_qkv_split

# Keller Jordan's quintic coefficients, one triple per step (written out again: the test is the spec)
QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def reference(g, coefficients=QUINTIC):
    """fp64 Newton-Schulz: the wide orientation, X / ||X||_F, X <- aX + (bA + cA^2)X with A = XX^T."""
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm().clamp_min(1e-7)
    for a, b, c in coefficients:
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


# Measured: fp32 is within 1.5e-6 of the largest entry of fp64 on these shapes. The tolerance leaves
# 60x room for another BLAS's order, and a wrong or missing coefficient, step or transpose moves entries by
# more than 1e-2 of it (test_a_wrong_schedule_is_far_outside_the_tolerance).
RTOL = 1e-4


@pytest.mark.parametrize("shape", [(64, 32), (32, 96), (48, 48), (1, 16), (200, 50)])
def test_newton_schulz_matches_fp64_reference(shape):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    want = reference(g)
    got = newton_schulz(g, coefficient_schedule("quintic", 5))
    assert got.dtype == torch.float32 and got.shape == g.shape
    assert (got.double() - want).abs().max() <= RTOL * want.abs().max()
    # what the quintic buys: every singular value near 1 (it does not converge to exactly 1, by design)
    if shape[0] != shape[1]:
        s = torch.linalg.svdvals(got.double())
        assert s.min() > 0.9 and s.max() < 1.1


def test_a_wrong_schedule_is_far_outside_the_tolerance():
    g = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    want = reference(g)
    for wrong in (coefficient_schedule("simple", 5), coefficient_schedule("quintic", 10), QUINTIC[:4]):
        got = newton_schulz(g, wrong)
        assert (got.double() - want).abs().max() > 1e-2 * want.abs().max()
    untransposed = newton_schulz(g, coefficient_schedule("quintic", 5), transpose=False)  # the Gram of the long side
    assert torch.allclose(untransposed, newton_schulz(g.T, coefficient_schedule("quintic", 5)).T, atol=1e-5)


def test_coefficient_rules():
    assert coefficient_schedule("quintic", 5) == QUINTIC and len(coefficient_schedule("quintic", 10)) == 10
    assert coefficient_schedule("simple", 3) == [(3.4445, -4.7750, 2.0315)] * 3
    assert len(coefficient_schedule("polar_express", 10)) == 10
    for kind, steps, words in (("quintic", 3, "multiple of 5"), ("polar_express", 5, "at least 8"),
                               ("cubic", 5, "unknown"), ("quintic", 0, "at least 1")):
        with pytest.raises(ValueError, match=words):
            coefficient_schedule(kind, steps)
    with pytest.raises(ValueError, match="TP mode"):
        MuonConfig(tp_mode="rowwise")


def test_scale_factors():
    assert scale_factor(1024, 256, "spectral") == 32.0 == scale_factor(256, 1024, "spectral")
    assert scale_factor(1024, 256, "unit_rms_norm") == 2.0 and scale_factor(256, 1024, "unit_rms_norm") == 0.5
    assert scale_factor(1024, 256, "shape_scaling") == 2.0 and scale_factor(256, 1024, "shape_scaling") == 1.0
    # spectral: an update whose RMS is about 1 whatever the shape (singular values ~1, min(m, n) of them)
    for shape in ((256, 64), (64, 256)):
        g = torch.randn(shape, generator=torch.Generator().manual_seed(3))
        u = newton_schulz(g, coefficient_schedule("quintic", 5)) * scale_factor(*shape, "spectral")
        assert 0.9 < u.pow(2).mean().sqrt() < 1.1


def _qkv(heads=4, query_groups=2, d=2, hidden=6):
    w = nn.Parameter(torch.randn(query_groups * (heads // query_groups + 2) * d, hidden,
                                 generator=torch.Generator().manual_seed(4)))
    set_qkv_split(w, (heads // query_groups * d, d, d))
    return w


def test_split_qkv_takes_q_k_v_of_every_query_group():
    w = _qkv()  # 2 query groups of [q (2 heads x d 2) = 4 rows, k 2 rows, v 2 rows]: 8 rows per group
    q, k, v = parts(w.detach(), (4, 2, 2))
    rows = torch.arange(16.0)[:, None].expand(16, 6)
    rq, rk, rv = (t[:, 0].tolist() for t in parts(rows, (4, 2, 2)))
    assert rq == [0, 1, 2, 3, 8, 9, 10, 11] and rk == [4, 5, 12, 13] and rv == [6, 7, 14, 15]
    assert torch.equal(q, w.detach()[[0, 1, 2, 3, 8, 9, 10, 11]])

    groups = types.SimpleNamespace(tp=None, etp=None)  # a whole (not TP-split) parameter: no group is used
    cfg = MuonConfig()
    schedule = coefficient_schedule("quintic", 5)
    got = orthogonalize(w.detach(), w, groups, cfg, schedule, torch.float32)
    want = torch.empty_like(w.detach())
    for idx, m in ((rq, q), (rk, k), (rv, v)):
        want[[int(i) for i in idx]] = newton_schulz(m, schedule) * max(m.shape) ** 0.5
    assert torch.equal(got, want)
    whole = orthogonalize(w.detach(), w, groups, MuonConfig(split_qkv=False), schedule, torch.float32)
    assert torch.equal(whole, newton_schulz(w.detach(), schedule) * 16 ** 0.5)
    assert ns_cost(w, groups, cfg) == sum(2 * 5 * (2 * max(m, 6) * min(m, 6) ** 2 + min(m, 6) ** 3) for m in (8, 4, 4))
