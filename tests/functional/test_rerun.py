"""The rerun check (issue 41, item 5: --rerun-mode, Megatron-Core's flags and defaults) through the CLI with
the injector (MEGATRON_DEBUG_FAULT ... :nan turns one rank's gradients into NaN before their reduction): a
one-off NaN on rank 1 is named a device fault (rank and host, exit code 16, nothing of the iteration applied);
a NaN the re-run reproduces is the data or the model: the NaN check stops the run as before (exit 17);
report_stats re-runs every iteration and finds the losses reproduced bitwise."""
import socket

import pytest

from .cli import run_cli
from .test_bad_inputs import assert_one_error_line
from .test_save_load_faults import TINY

DP2 = TINY + ["--train-iters", "4"]


@pytest.mark.slow
def test_a_one_off_nan_on_one_rank_is_a_device_fault_naming_it():
    proc = run_cli(DP2, nproc=2, check=False, timeout=300, env={"MEGATRON_DEBUG_FAULT": "train.grads:3:1:nan"})
    assert_one_error_line(proc, f"iteration 3: rank 1 (host {socket.gethostname()}) computed non-finite gradients, "
                                "but the iteration re-run from the same state did not: not reproducible, so a faulty "
                                "device is suspected", torchrun=True, ran=True)
    assert "exitcode  : 16" in proc.stderr and "iteration        3/" not in proc.stdout


@pytest.mark.slow
def test_a_nan_every_run_reproduces_and_is_the_data_or_the_model():
    fault = "train.grads:3:1:nan,train.grads.rerun:3:1:nan"
    proc = run_cli(DP2, nproc=2, check=False, timeout=300, env={"MEGATRON_DEBUG_FAULT": fault})
    assert_one_error_line(proc, "iteration 3: the gradient norm (global over all ranks) is nan", torchrun=True,
                          ran=True)
    assert "exitcode  : 17" in proc.stderr


def test_report_stats_reruns_every_iteration_and_finds_it_bitwise():
    proc = run_cli(TINY + ["--train-iters", "3", "--rerun-mode", "report_stats"])
    assert "> rerun stats (--rerun-mode report_stats): 3 iterations re-run, the loss reproduced bitwise in 3, " \
           "largest relative difference 0.000e+00" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
def test_the_straggler_report_names_a_rank_slowed_down():
    env = {"MEGATRON_DEBUG_FAULT": "train.forward_backward:*:1:slow", "MEGATRON_DEBUG_SLOW_SECONDS": "0.4"}
    proc = run_cli(TINY + ["--train-iters", "4", "--log-interval", "2", "--log-straggler"], nproc=2, timeout=300,
                   env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith(" straggler report")]
    assert [x.split(":")[0] for x in lines] == [f" straggler report, iterations {a}-{b}" for a, b in ((1, 2), (3, 4))]
    for line in lines:
        slowest, fastest = line.split("slowest ")[1].split("; fastest ")
        assert slowest.startswith("rank 1 (") and fastest.startswith("rank 0 ("), line
        assert float(line.rsplit("slowest / fastest ", 1)[1]) > 2, line  # 400 ms against a tiny model's step
