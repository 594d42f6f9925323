"""Rounding bounds for tests that compare two computations of one function whose floating-point
operations run in another order (another GEMM blocking or vector width, a sum split in two, a fused op
against its parts). A tolerance taken from here holds on any CPU and BLAS; one tuned on this machine
does not (CI's CPUs re-sum fp32 in another order than ours: issue 26).

One operation, elementwise and rigorous (Higham, Accuracy and Stability of Numerical Algorithms, 2nd
ed., §3.1, eq. 3.4 and §4.2): a sum of n terms in any order is within gamma(n - 1) * sum|terms| of the
exact sum, gamma(k) = k u / (1 - k u), u the unit roundoff (2^-24 fp32, 2^-53 fp64); two orders differ
by at most twice that. A product A @ B with inner dimension k: 2 gamma(k) (|A| @ |B|).

A whole model (a chain of ops, forward and backward): compare in fp64 against CHAIN_RTOL_FP64 times
the largest magnitude of the compared tensor. To first order each op adds at most gamma(n) of the
magnitude of its terms and the ops after it carry that on linearly. The models in these tests chain
fewer than 10^2 ops, reduce fewer than 10^4 terms at a time, and no op's terms exceed 10 times its
result in magnitude (no catastrophic cancellation: random N(0, 1)-scale values), so two orders differ
by less than 10^2 * 2 gamma(10^4) * 10 = 2e7 u = 2.2e-9 of the largest value. A wrong, missing or
doubled term changes a gradient by far more than 1e-8 of its largest value.
"""
import torch

CHAIN_RTOL_FP64 = 1e-8  # above the 2.2e-9 bound derived above


def unit_roundoff(dtype) -> float:
    return torch.finfo(dtype).eps / 2


def gamma(k: int, dtype) -> float:
    ku = k * unit_roundoff(dtype)
    assert ku < 0.5, f"{k} terms: no useful bound in {dtype}"
    return ku / (1 - ku)


def sum_bound(x, dim):
    """How far two summation orders of x.sum(dim) can differ, elementwise."""
    return 2 * gamma(max(x.shape[dim] - 1, 0), x.dtype) * x.abs().sum(dim)


def matmul_bound(a, b):
    """How far two summation orders of a @ b can differ, elementwise."""
    return 2 * gamma(a.shape[-1], a.dtype) * (a.abs() @ b.abs())


def assert_within(got, want, bound, what=""):
    """|got - want| <= bound elementwise (bound: a tensor broadcastable to want, or a number)."""
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} vs {want.shape}"
    excess = (got - want).abs() - bound
    worst = excess.max().item() if excess.numel() else 0.0
    assert worst <= 0, f"{what}: differs by up to {worst:.3g} more than rounding can explain"


def assert_chain_close(got, want, what=""):
    """fp64 results of a whole model computed in two orders (module docstring)."""
    assert want.dtype == torch.float64, f"{what}: compare chains in fp64, not {want.dtype}"
    assert_within(got, want, CHAIN_RTOL_FP64 * want.abs().max().item(), what)
