"""Issue 27's CPU traffic budget (bench/traffic.py): one full training step of ours must move at most
0.90x the bytes of the plain PyTorch loop (bench/plain_models.py) and launch no more kernels, at
the GPT-3 1.3B shape of the GPU measurements with hidden, tokens and vocabulary divided by 8
(24 layers, hidden 256, 16 heads, seq 256, micro batch 4 x 4, vocab 6288, bf16).

The budget is counted on fake tensors (shapes only, no arithmetic); tests/unit/test_op_traffic.py
checks that they count exactly what real ones do. Printed on failure: the per-op table (ours vs
plain, scaled to the GPU shape) that says where the bytes and launches go.
"""
import pytest

from bench import pair, traffic
from tests.harness import spawn

BUDGET_BYTES = 0.90   # ours / plain loop, bytes per step
SCALE = 8


def _count(groups, shape, fake):
    return traffic.count_step(groups, shape, fake=fake)


@pytest.fixture(scope="module")
def budget():
    shape = pair.PRESETS["gpt-1.3b"].scaled(SCALE)
    counts = spawn(1, _count, shape, True, timeout=900)[0]
    ours, plain = (traffic.scaled(counts[n], SCALE) for n in ("ours", "plain"))
    report = ("\nper-op traffic per step, scaled to the GPU shape (bytes x 64):\n"
              + traffic.table(ours, plain, 4.3e12, 790e12, rows=30))
    return traffic.total(ours), traffic.total(plain), report


def test_bytes_per_step_within_budget(budget):
    ours, plain, report = budget
    assert ours.bytes <= BUDGET_BYTES * plain.bytes, (
        f"ours moves {ours.bytes / plain.bytes:.3f}x the plain loop's bytes per step "
        f"(budget {BUDGET_BYTES}x){report}")


def test_launches_per_step_within_budget(budget):
    ours, plain, report = budget
    assert ours.launches <= plain.launches, (
        f"ours launches {ours.launches} kernels per step, the plain loop {plain.launches}{report}")
