"""--data-parallel-sharding-strategy through the CLI: parity with one process (ZeRO-2 and ZeRO-3 with
TP+SP, PP, interleaved PP, overlap, recompute), bytes per rank (log = formula = estimator), and
layout-free checkpoints between ZeRO-3 and one process. Each run proves what the others do not:

- ZeRO-3 TP2xPP2xDP2 + SP, overlap on: sequence-parallel sums on the gradient shards, the tied word
  table summed over the first and last stage before the DP reduce-scatter, prefetched gathers; it
  saves, and one process loads its checkpoint.
- ZeRO-3 PP2xVPP2xDP2, overlap off, full recompute: units of several model chunks, re-gathered by the
  recomputed forward; it loads the one-process checkpoint.
- ZeRO-2 PP2xDP2: the ZeRO-2 buffers (whole parameters, gradient shards) with the tied table, and
  --optimizer-cpu-offload of half of each rank's optimizer state (host copies, host AdamW); it saves,
  and one process loads its checkpoint.
Every run has 2 microbatches per DP rank: gradient accumulation is in all of them.
"""
import os
import re

import pytest

from .cli import run_cli, run_metrics
from .test_parity import BASE, max_relative_differences
from .test_precision_memory import _bytes, _estimate

ITERS = 4
FLAGS = list(BASE) + ["--num-layers", "4", "--lr", "1e-3"]
FLAGS[FLAGS.index("--train-iters") + 1] = str(ITERS)
FLAGS[FLAGS.index("--eval-interval") + 1] = "2"
Z2, Z3 = (["--data-parallel-sharding-strategy", s] for s in ("optim_grads", "optim_grads_params"))
OVERLAP = ["--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "1000"]
TOL = 1e-5  # relative, losses and grad norms at every iteration (they stay within 2e-7 here)
_ref = {}


def reference(tmp_path_factory):
    """The one-process run, saving at iteration 2."""
    if not _ref:
        d = str(tmp_path_factory.mktemp("zero-ref"))
        _ref.update(dir=d, metrics=run_metrics(FLAGS + ["--save", d, "--save-interval", "2"])[1])
    return _ref


def _back_to_iteration_2(d):
    with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("2")


def _assert_close(ref, got, iterations):
    """Losses and grad norms of `got` (a run resumed before `iterations`) against the reference's."""
    assert sorted(got["train"]) == list(iterations)
    rel = max(abs(got["train"][it][k] - ref["train"][it][k]) / abs(ref["train"][it][k])
              for it in iterations for k in ("grad_norm",))
    rel = max([rel] + [abs(got["train"][it]["losses"]["lm loss"] / ref["train"][it]["losses"]["lm loss"] - 1)
                       for it in iterations])
    print(f"resumed at iterations {iterations}: largest relative difference {rel:.2e}")
    assert rel <= TOL


@pytest.mark.slow
def test_zero3_tp2_pp2_dp2_sp_overlap_matches_one_process_and_its_checkpoint_loads_at_one(tmp_path_factory):
    ref = reference(tmp_path_factory)
    d = str(tmp_path_factory.mktemp("zero3-save"))
    flags = FLAGS + Z3 + OVERLAP + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--pipeline-model-parallel-size", "2"]
    proc, got = run_metrics(flags + ["--save", d, "--save-interval", "2"], nproc=8)
    diff = max_relative_differences(ref["metrics"], got)
    print(diff)
    assert max(diff.values()) <= TOL, diff
    _, params, grads, opt = _bytes(proc.stdout)
    assert _estimate(flags, 8)[:3] == [params, grads, opt]
    assert "data-parallel sharding: optim_grads_params" in proc.stdout
    _back_to_iteration_2(d)
    _assert_close(ref["metrics"], run_metrics(FLAGS + ["--load", d])[1], [3, 4])


@pytest.mark.slow
def test_zero3_interleaved_pp2_vpp2_dp2_recompute_matches_one_process_and_loads_a_one_process_checkpoint(
        tmp_path_factory):
    ref = reference(tmp_path_factory)
    flags = FLAGS + Z3 + ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                          "--recompute-granularity", "full", "--recompute-method", "uniform",
                          "--recompute-num-layers", "1"]
    diff = max_relative_differences(ref["metrics"], run_metrics(flags, nproc=4)[1])
    print(diff)
    assert max(diff.values()) <= TOL, diff
    _back_to_iteration_2(ref["dir"])
    _assert_close(ref["metrics"], run_metrics(flags + ["--load", ref["dir"]], nproc=4)[1], [3, 4])


@pytest.mark.slow
def test_zero2_pp2_dp2_with_half_the_optimizer_on_the_host_matches_one_process_and_its_checkpoint_loads_at_one(
        tmp_path_factory):
    ref = reference(tmp_path_factory)
    d = str(tmp_path_factory.mktemp("zero2-save"))
    proc, got = run_metrics(FLAGS + Z2 + ["--pipeline-model-parallel-size", "2", "--optimizer-cpu-offload",
                                          "--optimizer-offload-fraction", "0.5", "--save", d, "--save-interval", "2"],
                            nproc=4)
    diff = max_relative_differences(ref["metrics"], got)
    print(diff)
    assert max(diff.values()) <= TOL, diff
    host = re.search(r"optimizer CPU offload: 50% .*: ([\d,]+) bytes on rank 0's host", proc.stdout)
    _, _, _, device = _bytes(proc.stdout)
    host = int(host.group(1).replace(",", ""))
    # fp32: 12 bytes per element on the host (own main copy + moments), 8 on the device (main aliases the param)
    assert host % 12 == 0 and device % 8 == 0 and 0.3 < (host / 12) / (host / 12 + device / 8) <= 0.5, (host, device)
    _back_to_iteration_2(d)
    _assert_close(ref["metrics"], run_metrics(FLAGS + ["--load", d])[1], [3, 4])


@pytest.mark.slow
@pytest.mark.parametrize("strategy,per_param", [("optim_grads", lambda n, d: (2 * n, 4 * n // d, 12 * n // d)),
                                                ("optim_grads_params", lambda n, d: (2 * n // d, 4 * n // d,
                                                                                     12 * n // d))])
def test_bf16_bytes_per_parameter_log_formula_and_estimator_agree(strategy, per_param):
    """bf16, fp32 main parameters and Adam at d = 2: optim_grads 2 + 16/d, optim_grads_params 18/d
    bytes per parameter (the tiny model's units and buckets need no padding at d = 2)."""
    flags = FLAGS + ["--train-iters", "1", "--eval-iters", "0", "--bf16", "--data-parallel-sharding-strategy", strategy]
    n, params, grads, opt = _bytes(run_cli(flags, nproc=2).stdout)
    assert (params, grads, opt) == per_param(n, 2)
    assert _estimate(flags, 2) == [params, grads, opt]


def test_conflicting_sharding_flags_are_one_line_errors():
    proc = run_cli(["--use-distributed-optimizer", "--data-parallel-sharding-strategy", "no_shard"] + FLAGS,
                   check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and "--data-parallel-sharding-strategy" in lines[0], proc.stderr[-2000:]
