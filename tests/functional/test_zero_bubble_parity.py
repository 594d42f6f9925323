"""Zero-bubble schedules through the CLI, fp32: the per-iteration losses and grad norms of one
process (test_parity.py's tiny model, 4 iterations, no evaluation). Each layout proves something
the others do not: PP4 runs ZB-H1's delayed W's over four stages; TP2 with sequence parallelism
runs the deferred weight gradients of the column/row layers (the gathered input kept for W) under
ZB-H2; PP2 x DP2 with the distributed optimizer and overlapped reduction checks that the DDP
bucket hooks see one gradient per microbatch when it comes from W. Other layouts by hand: the note
of issue 19."""
import pytest

from .cli import run_metrics
from .test_parity import BASE, DEEP, PP2, PP4, SMALL_BUCKETS, TP2, assert_metrics_parity

FAST = [a if prev not in ("--train-iters", "--eval-iters") else {"--train-iters": "4", "--eval-iters": "0"}[prev]
        for prev, a in zip([None] + BASE[:-1], BASE)]
_ref = []


def _reference():
    if not _ref:
        _ref.append(run_metrics(FAST + DEEP)[1])
    return _ref[0]


LAYOUTS = {
    "pp4-zb-h1": (4, PP4 + ["--pipeline-schedule", "zb-h1"]),
    "tp2-sp-pp2-zb-h2": (4, TP2 + PP2 + ["--sequence-parallel", "--pipeline-schedule", "zb-h2"]),
    "pp2-dp2-distopt-overlap-zb-h1": (4, PP2 + ["--pipeline-schedule", "zb-h1", "--use-distributed-optimizer",
                                                "--overlap-grad-reduce"] + SMALL_BUCKETS),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero_bubble_schedule_matches_one_process(name):
    nproc, flags = LAYOUTS[name]
    got = run_metrics(FAST + DEEP + flags, nproc=nproc)[1]
    assert_metrics_parity(_reference(), got)


def test_pipeline_schedule_flag_that_does_not_fit_the_layout_is_one_line_and_exit_2():
    from .cli import run_cli
    proc = run_cli(FAST + ["--pipeline-schedule", "interleaved"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--pipeline-schedule interleaved needs more than one model chunk per rank" in proc.stderr
