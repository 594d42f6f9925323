"""The kernel table on file tells the truth for this GPU (bench/kernels.py, bf16, GPU time of
forward + backward from CUDA graph replays).

Every op whose committed default on this GPU model (megatron/core/fusions/kernel_table.json)
is our kernel must, measured now, beat both eager torch and torch.compile (5% slack for
noise): a kernel the fronts pick by default that has become slower fails here. The figures,
with achieved TB/s against this run's copy bandwidth, are printed for every op; a GPU with no
entry in the table has nothing to check (its fronts run torch) beyond the kernels running.
"""
import pytest
import torch

from bench import kernels as bench
from megatron.core.fusions import kernel_table

SLACK = 1.05


@pytest.fixture(scope="module")
def rows(ext):
    return {r["op"]: r for r in bench.run(dtype="bf16", repeats=20)}


@pytest.mark.parametrize("op", sorted(bench.OPS))
def test_default_kernels_beat_eager_and_compiled(rows, op):
    r = rows[op]
    print(f"\n{op}: fused {r['fused_ms']:.3f} ms ({r['fused_tb_s']:.2f} TB/s, {r['fused_x_roofline']:.2f}x roofline), "
          f"eager {r['eager_ms']:.3f}, compiled {r['compiled_ms']:.3f}; copy {r['copy_tb_s']:.2f} TB/s")
    entry = kernel_table.load(kernel_table.DEFAULT_PATH).get(torch.cuda.get_device_name(), {}).get(op)
    if entry is None or entry["default"] != "csrc":
        pytest.skip(f"{op} is not a csrc default on this GPU: nothing to hold it to")
    assert r["fused_ms"] <= SLACK * min(r["eager_ms"], r["compiled_ms"]), r
