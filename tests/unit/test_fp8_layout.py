"""FP8 column- and row-parallel linears at TP2 with sequence parallelism (x CP2) against one process's FP8
linear on the whole tensors, on real gloo ranks.

With the amaxes of split tensors MAX-reduced over the TP and CP groups, every rank casts every element of
its pieces to the FP8 value one process gives it; what remains is fp32 summation order: each GEMM's K sum
((K + 3) u sum |a b|, u = 2^-24, as in test_fp8_recipes.py), doubled for the two sides, plus the TP sum
of partials. A piece cast with its own scale instead moves elements by FP8 steps (2^-4 relative), far
outside that bound. Delayed scaling's scales after a step equal one process's, bitwise.
"""
from types import SimpleNamespace

import torch

from megatron.core import comm
from megatron.core.fp8.linear import fp8_linear
from megatron.core.fp8.recipes import build_recipe
from megatron.core.fp8.step import after_step, delayed_scalers
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from tests.harness import spawn

U = 2.0 ** -24
S, B, H, F = 8, 2, 128, 256  # sequence, batch, hidden, ffn: TP shards of 128 (blockwise tiles)


def _settings(recipe):
    return SimpleNamespace(fp8_recipe=recipe, fp8_format="hybrid", fp8_margin=0, fp8_amax_history_len=2,
                           fp8_amax_compute_algo="max")


def _full(seed, *shape, std=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * std


def _bound(a, b, k):
    """2 (k + 4) u |a| |b|^T for [M, k] and [N, k] fp64 magnitudes (both sides' sums and the TP sum)."""
    return 2 * (k + 4) * U * (a.abs() @ b.abs().t())


def _check(got, ref, bound, what):
    err = (got.double() - ref.double()).abs()
    assert (err <= bound).all(), f"{what}: error {err.max():.3e} over the bound by {(err - bound).max():.3e}"


def _pieces(groups, x, dim_tp):
    """This rank's piece of a whole [s, b, n] tensor: its CP chunk of the sequence, then its TP shard along
    dim_tp (0: the sequence, sequence parallel; 2: features)."""
    cp, tp = groups.cp_size, groups.tp_size
    x = x.chunk(cp, 0)[groups.cp_rank]
    return x.chunk(tp, dim_tp)[groups.tp_rank].contiguous()


def _body(groups, recipes, seq=S):
    return [_run(groups, recipe, 2 if recipe == "delayed" else 1, seq) for recipe in recipes]


def _misaligned(groups):
    """Blockwise at CP chunks of 64 tokens: the one-process weight-gradient tiles of 128 tokens span both CP
    ranks' chunks -> the error of the check that fails (one line), None if every check passes."""
    try:
        _run(groups, "blockwise", 1, 32)
    except AssertionError as e:
        return str(e).split(":")[0]
    return None


def _run(groups, recipe, steps, seq=S):
    torch.manual_seed(0)
    settings = _settings(recipe)
    tp, cp = groups.tp_size, groups.cp_size
    col = ColumnParallelLinear(H, F, group=groups.tp, bias=False, sequence_parallel=True, fp8=settings,
                               cp_group=groups.cp)
    row = RowParallelLinear(F, H, group=groups.tp, bias=False, sequence_parallel=True, fp8=settings,
                            cp_group=groups.cp)
    w1, w2 = _full(1, F, H, std=0.02), _full(2, H, F, std=0.02)
    with torch.no_grad():
        col.weight.copy_(w1.chunk(tp, 0)[groups.tp_rank])
        row.weight.copy_(w2.chunk(tp, 1)[groups.tp_rank])
    ref_col, ref_row = (build_recipe(settings, (), ()) for _ in range(2))
    for step in range(steps):
        x1, g1 = _full(10 + step, seq, B, H), _full(20 + step, seq, B, F, std=1e-3)
        x2, g2 = _full(30 + step, seq, B, F), _full(40 + step, seq, B, H, std=1e-3)
        for layer, ref_recipe, w, x, g, x_dim, g_dim, k_fwd in (
                (col, ref_col, w1, x1, g1, 0, 2, H), (row, ref_row, w2, x2, g2, 2, 0, F)):
            xl = _pieces(groups, x, x_dim).requires_grad_()
            layer.weight.grad = None
            y = layer(xl)[0]
            y.backward(_pieces(groups, g, g_dim))
            xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
            yr = fp8_linear(xr, wr, None, ref_recipe)
            yr.backward(g)
            xa, wa, ga = x.reshape(-1, x.shape[-1]), w, g.reshape(-1, g.shape[-1])
            fwd_bound = _bound(xa.double(), wa.double(), k_fwd).view_as(yr)
            _check(y, _pieces(groups, yr.detach(), g_dim), _pieces(groups, fwd_bound, g_dim), "forward")
            dx_bound = _bound(ga.double(), wa.t().double(), wa.shape[0]).view_as(xr)
            _check(xl.grad, _pieces(groups, xr.grad, x_dim), _pieces(groups, dx_bound, x_dim), "dgrad")
            dw = comm.all_reduce_(layer.weight.grad.clone(), groups.cp) if cp > 1 else layer.weight.grad
            dw_bound = _bound(ga.t().double(), xa.t().double(), xa.shape[0])
            tp_dim = 0 if layer is col else 1
            _check(dw, wr.grad.chunk(tp, tp_dim)[groups.tp_rank], dw_bound.chunk(tp, tp_dim)[groups.tp_rank],
                   "wgrad")
        after_step([col, row], None)
        after_step([ref_col, ref_row], None)
        for mine, ref in zip(delayed_scalers([col, row]), delayed_scalers([ref_col, ref_row])):
            assert torch.equal(mine.scale_, ref.scale_) and torch.equal(mine.amax_history, ref.amax_history)
    return len(delayed_scalers([col, row]))


def test_fp8_tp2_sp_cp2_per_tensor_linears_cast_as_one_process():
    assert spawn(4, _body, ["tensorwise", "delayed"], tp=2, cp=2) == [[0, 6]] * 4  # delayed: 3 scalers a linear


def test_fp8_tp2_sp_blockwise_linears_cast_as_one_process():
    """Blockwise at TP2 + SP."""
    assert spawn(2, _body, ["blockwise"], tp=2) == [[0]] * 2


def test_fp8_tp2_sp_cp2_blockwise_linears_cast_as_one_process_where_chunks_are_whole_tiles():
    """Blockwise at TP2 + SP x CP2: the weight gradient's tiles run along the tokens, so each CP rank's tokens
    (sequence 128 / 2 x batch 2 = 128) must be whole tiles of one process's (check_fp8_layout refuses others); at
    sequence 32 (32 tokens a rank) the tiles span the CP ranks and the weight gradients miss the bound."""
    assert spawn(4, _body, ["blockwise"], 128, tp=2, cp=2) == [[0]] * 4
    assert spawn(4, _misaligned, tp=2, cp=2) == ["wgrad"] * 4
