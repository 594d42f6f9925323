"""Fused kernels vs eager torch and torch.compile, forward + backward, bf16 (bench/kernels.py).

Where eager torch runs several kernels for the op (scale + mask + softmax, bias add + GeLU,
chunk + SiLU + multiply, the rotate-half arithmetic), the fused kernel must not be slower than
eager. For the norms, eager F.layer_norm is already one fused kernel: the timings are only
reported. Never run on a GPU so far; the thresholds are the claim, not a measurement.
"""
import pytest

from bench import kernels as bench

MUST_NOT_LOSE_TO_EAGER = {"masked softmax", "causal softmax", "bias-gelu", "bias-swiglu", "rope"}


@pytest.fixture(scope="module")
def rows(ext):
    return bench.run(dtype="bf16", repeats=20)


@pytest.mark.parametrize("op", sorted(bench.OPS))
def test_fused_vs_eager_and_compile(rows, op):
    row = next(r for r in rows if r["op"] == op)
    print(f"\n{op}: fused {row['fused_ms']:.3f} ms, eager {row['eager_ms']:.3f} ms, "
          f"compiled {row['compiled_ms']:.3f} ms")
    if op in MUST_NOT_LOSE_TO_EAGER:
        assert row["fused_ms"] <= 1.05 * row["eager_ms"], row
