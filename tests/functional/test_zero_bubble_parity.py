"""Zero-bubble schedules through the CLI, fp32: the per-iteration losses and grad norms of one
process (test_parity.py's tiny model, 4 iterations, no evaluation). Each layout proves something
the others do not: PP4 runs ZB-H1's delayed W's over four stages; TP2 with sequence parallelism
runs the column/row layers' weight gradients in W (the sequence-parallel input gathered again there)
under ZB-H2; PP2 x DP2 with the distributed optimizer and overlapped reduction checks that the DDP
bucket hooks see one gradient per microbatch when it comes from W; TP2 x PP2 with full recompute of
one layer per stage splits the recomputed segment's backward too (backward_split.py). ZB-V (8
layers, so 2P stages at PP4): PP4 runs the V layout's turn on the last rank and both tied-table
copies on rank 0, and its checkpoint loads at one process (global layer numbering); PP2 x DP2 with overlapped reduction
checks the two tied copies' gradients are summed once per microbatch. Other layouts by hand: the
note of issue 19."""
import os

import pytest

from .cli import run_cli, run_metrics
from .test_parity import BASE, DEEP, PP2, PP4, SMALL_BUCKETS, TP2, assert_metrics_parity

FAST = [a if prev not in ("--train-iters", "--eval-iters") else {"--train-iters": "4", "--eval-iters": "0"}[prev]
        for prev, a in zip([None] + BASE[:-1], BASE)]
V8 = ["--num-layers", "8", "--lr", "1e-3"]  # ZB-V: 2P stages of layers at PP4
_ref = {}


def _reference(model=tuple(DEEP)):
    if model not in _ref:
        _ref[model] = run_metrics(FAST + list(model))[1]
    return _ref[model]


LAYOUTS = {
    "pp4-zb-h1": (4, PP4 + ["--pipeline-schedule", "zb-h1"]),
    "tp2-sp-pp2-zb-h2": (4, TP2 + PP2 + ["--sequence-parallel", "--pipeline-schedule", "zb-h2"]),
    "pp2-dp2-distopt-overlap-zb-h1": (4, PP2 + ["--pipeline-schedule", "zb-h1", "--use-distributed-optimizer",
                                                "--overlap-grad-reduce"] + SMALL_BUCKETS),
    # the first layer of each stage recomputed (reentrant: its B is a nested one), the second not
    "tp2-sp-pp2-recompute-zb-h1": (4, TP2 + PP2 + ["--sequence-parallel", "--pipeline-schedule", "zb-h1",
                                                   "--recompute-granularity", "full", "--recompute-method", "block",
                                                   "--recompute-num-layers", "1"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero_bubble_schedule_matches_one_process(name):
    nproc, flags = LAYOUTS[name]
    got = run_metrics(FAST + DEEP + flags, nproc=nproc)[1]
    assert_metrics_parity(_reference(), got)


ZB_V = ["--pipeline-schedule", "zb-v"]


@pytest.mark.slow
def test_zb_v_at_pp4_matches_one_process_and_its_checkpoint_loads_at_one_process(tmp_path):
    d = str(tmp_path)
    got = run_metrics(FAST + V8 + PP4 + ZB_V + ["--save", d, "--save-interval", "2"], nproc=4)[1]
    ref = _reference(tuple(V8))
    assert_metrics_parity(ref, got)
    with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("2")  # back to iteration 2: one process runs 3 and 4 from the V layout's checkpoint
    resumed = run_metrics(FAST + V8 + ["--load", d], nproc=1)[1]
    assert sorted(resumed["train"]) == [3, 4]
    for it in (3, 4):  # the checkpoint holds the weights and Adam moments of iteration 2
        want, have = ref["train"][it], resumed["train"][it]
        rel = max(abs(have["losses"]["lm loss"] / want["losses"]["lm loss"] - 1),
                  abs(have["grad_norm"] / want["grad_norm"] - 1))
        assert rel <= 1e-5, f"iteration {it} after loading the ZB-V checkpoint at one process: relative {rel:.2e}"


@pytest.mark.slow
def test_zb_v_pp2_dp2_overlapped_reduction_matches_one_process():
    flags = PP2 + ZB_V + ["--overlap-grad-reduce"] + SMALL_BUCKETS
    assert_metrics_parity(_reference(tuple(V8)), run_metrics(FAST + V8 + flags, nproc=4)[1])


def test_zb_v_with_layers_that_do_not_split_into_2p_stages_is_one_line_and_exit_2():
    proc = run_cli(FAST + DEEP + PP4 + ZB_V, check=False)  # 4 layers, 8 stages
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--pipeline-schedule zb-v needs --num-layers (4) divisible by 2 x --pipeline-model-parallel-size" \
        in proc.stderr


def test_pipeline_schedule_flag_that_does_not_fit_the_layout_is_one_line_and_exit_2():
    proc = run_cli(FAST + ["--pipeline-schedule", "interleaved"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--pipeline-schedule interleaved needs more than one model chunk per rank" in proc.stderr
