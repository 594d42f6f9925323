"""ZeRO-2 / ZeRO-3 with MoE expert parallelism through the CLI: the expert buffers are sharded over the
expert-data-parallel group (groups.edp) as the dense ones over DP, and every run gives the per-iteration
losses (token, load-balancing, z) and grad norms (clipped at 1.0 in every iteration here) of one process.
Each run proves what the others do not:

- ZeRO-2 EP2 x DP2 (EDP 2), alltoall, --overlap-grad-reduce, small buckets: expert gradient buckets
  reduce-scattered over EDP while backward goes on, each rank keeping its EDP shard; bytes per rank
  (start-up log) equal tools/estimate_memory.py's with the experts sharded over EDP, not DP.
- ZeRO-3 EP2 x DP2 (EDP 2), grouped GEMM, overlap (grad reduce and prefetched gathers): a MoE layer's
  unit gathers its dense bucket over DP and its expert bucket over EDP; log = estimator, the gathered
  working set included; it saves, and one process loads its checkpoint at iteration 2 and continues.
- ZeRO-3 EP2 at DP2 (EDP 1), allgather, 2 microbatches per rank: expert buffers with nothing to shard,
  held whole and never gathered (log = estimator: they are not in the gathered working set).
"""
import re

import pytest

from .cli import run_cli, run_metrics
from .test_moe_parity import EP2, FLAGS, MOE, TERMS, reference
from .test_parity import assert_metrics_parity
from .test_precision_memory import _bytes
from .test_zero_cli import _back_to_iteration_2

Z2, Z3 = (["--data-parallel-sharding-strategy", s] for s in ("optim_grads", "optim_grads_params"))
OVERLAP = ["--overlap-grad-reduce", "--ddp-bucket-size", "1000"]
GATHERED = r"gathered parameters up to ([\d,]+)"


def _estimate(flags, world):
    """(params, grads, optimizer, gathered) bytes per rank from tools/estimate_memory.py."""
    out = run_cli(["--world-size", str(world)] + flags, script="tools/estimate_memory.py", pinned=False).stdout
    m = re.search(r"bytes: params ([\d,]+) grads ([\d,]+) optimizer ([\d,]+)", out)
    g = re.search(GATHERED, out)
    return [int(x.replace(",", "")) for x in m.groups() + ((g.group(1),) if g else ("0",))]


def _logged(stdout):
    g = re.search(GATHERED, stdout)
    return _bytes(stdout)[1:] + [int(g.group(1).replace(",", "")) if g else 0]


@pytest.mark.slow
def test_zero2_ep2_dp2_overlap_matches_one_process_and_estimator():
    flags = FLAGS + MOE + EP2 + Z2 + OVERLAP + ["--moe-token-dispatcher-type", "alltoall"]
    proc, got = run_metrics(flags, nproc=4)
    assert_metrics_parity(reference(), got, TERMS)
    assert _logged(proc.stdout) == _estimate(flags, 4)


@pytest.mark.slow
def test_zero3_ep2_dp2_matches_one_process_and_its_checkpoint_continues_at_one(tmp_path):
    d = str(tmp_path / "ck")
    flags = FLAGS + MOE + EP2 + Z3 + OVERLAP + ["--overlap-param-gather", "--moe-grouped-gemm"]
    proc, first = run_metrics(flags + ["--save", d, "--save-interval", "2"], nproc=4)
    ref = reference()
    assert_metrics_parity(ref, first, TERMS)
    logged = _logged(proc.stdout)
    assert logged == _estimate(flags, 4) and logged[-1] > 0
    _back_to_iteration_2(d)
    second = run_metrics(FLAGS + MOE + ["--load", d])[1]
    assert sorted(second["train"]) == [3, 4]
    got = {"train": {1: first["train"][1], 2: first["train"][2], **second["train"]}, "validation": {}}
    assert_metrics_parity(ref, got, TERMS)


@pytest.mark.slow
def test_zero3_ep2_at_dp2_expert_dp_1_matches_one_process():
    flags = FLAGS + MOE + EP2 + Z3
    proc, got = run_metrics(flags, nproc=2)
    assert_metrics_parity(reference(), got, TERMS)
    assert _logged(proc.stdout) == _estimate(flags, 2)  # the experts, whole, not in the gathered set
