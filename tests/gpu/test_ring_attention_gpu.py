"""Ring attention on a GPU with the fused block kernels (ring_kernels.py: flash, cuDNN, efficient),
forward and backward, causal and full, GQA, against the explicit-math ring, one-process attention
(torch's SDPA over the whole sequence) and fp64 attention from the same rounded inputs.

Three ranks of the ring run as threads on the one GPU (tests/ring_threads.py: the real ring but its
transport), chunks of 40 rows (the efficient kernel's log-sum-exp is padded to rows of 32), head dim 64.

Tolerances, as normwise relative errors ||x - ref|| / ||ref|| (u: the dtype's unit roundoff, 2^-8 for
bf16, 2^-11 for fp16): each block's output is rounded to the dtype before the fp32 merge and the
kernels round P (and in backward dS) to the dtype before their second matmul, the final output and
gradients are rounded once more: a few roundings of relative size u each, so the output is allowed
4u and the gradients 8u against fp64 and against the explicit-math ring (itself rounded once), and
twice that against one-process SDPA (whose own kernel rounds as much). fp32 (the efficient kernel,
3xTF32 matmuls on sm80+): 1e-5.
"""
import math

import pytest
import torch

from megatron.core.transformer.ring_kernels import choose_kernel, usable_kernels
from tests.ring_threads import run_ring

CP, CHUNK, HEADS, GROUPS, D = 3, 40, 4, 2, 64
U = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
TOL = {**{dt: (4 * u, 8 * u) for dt, u in U.items()}, torch.float32: (1e-5, 1e-5)}  # (output, gradients)


def _inputs(dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    S = 2 * CP * CHUNK
    q, dout = (torch.randn(2, HEADS, S, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(2, GROUPS, S, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    return q, k, v, dout


def _attention(q, k, v, dout, scale, causal):
    """Whole-sequence attention and its gradients: fp64 written out, or torch's SDPA in the inputs' dtype."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if q.dtype == torch.float64:
        ke, ve = (t.repeat_interleave(HEADS // GROUPS, dim=1) for t in leaves[1:])
        s = leaves[0] @ ke.transpose(-1, -2) * scale
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        out = torch.softmax(s, -1) @ ve
    else:
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale, enable_gqa=True)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _check(got, want, tol, what):
    for name, g, w, t in zip(("out", "dq", "dk", "dv"), got, want, (tol[0],) + (tol[1],) * 3):
        assert torch.isfinite(g).all(), f"{what} {name}: not finite"
        err = _rel(g, w)
        assert err <= t, f"{what} {name}: normwise relative error {err:.3g} > {t:.3g}"


# the efficient kernel: fp32 only (its half-precision backward from a merged log-sum-exp gave
# non-finite dq on an H200 on 2026-11-26, and BlockKernel refuses it)
CASES = [(k, dt) for k in ("flash", "cudnn") for dt in (torch.bfloat16, torch.float16)]
CASES.append(("efficient", torch.float32))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("kernel, dtype", CASES, ids=[f"{k}-{str(dt)[6:]}" for k, dt in CASES])
def test_ring_with_fused_kernel_is_attention(kernel, dtype, causal):
    if kernel not in usable_kernels("cuda"):
        pytest.skip(f"{kernel} is not usable on this GPU / torch build ({sorted(usable_kernels('cuda'))})")
    q, k, v, dout = _inputs(dtype, seed=7 + causal)
    scale = 1 / math.sqrt(D)
    exact = _attention(*(t.double() for t in (q, k, v, dout)), scale, causal)
    ring = run_ring(q, k, v, dout, CP, scale, causal, kernel)
    math_ring = run_ring(q, k, v, dout, CP, scale, causal, "math")
    one_process = _attention(q, k, v, dout, scale, causal)
    assert all(t.dtype == dtype for t in ring)
    tol = TOL[dtype]
    _check(ring, exact, tol, f"{kernel} ring vs fp64")
    _check(math_ring, exact, tol, "explicit-math ring vs fp64")
    _check(ring, math_ring, tol, f"{kernel} ring vs explicit-math ring")
    _check(ring, one_process, (2 * tol[0], 2 * tol[1]), f"{kernel} ring vs one-process SDPA")


def test_the_default_kernel_on_this_gpu_is_a_fused_one():
    """bf16 at head dim 64 on sm80+: flash (cuDNN where flash is off); the ring's default is that kernel."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash and cuDNN attention need sm80")
    kernel = choose_kernel("cuda", torch.bfloat16, D, usable_kernels("cuda"))
    assert kernel in ("flash", "cudnn"), (kernel, sorted(usable_kernels("cuda")))
    q, k, v, dout = _inputs(torch.bfloat16, seed=3)
    default = run_ring(q, k, v, dout, CP, 0.125, True)
    named = run_ring(q, k, v, dout, CP, 0.125, True, kernel)
    assert all(torch.equal(a, b) for a, b in zip(default, named))
