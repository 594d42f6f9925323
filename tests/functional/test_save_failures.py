"""A failed save does not end the run (issue 41, item 2), through the CLI with injected faults
(MEGATRON_DEBUG_FAULT, megatron/core/debug.py): one warning line naming the iteration, the path and the
cause, the partial iter_X.tmp/ removed, the last good checkpoint intact and named by the tracker,
training going on and the next interval saving again; --max-consecutive-save-failures failures in a
row end the run with one line, exit 2. A full tmpfs at the final save: test_save_load_faults.py."""
import os

import pytest

from megatron.core.checkpointing import iter_dir
from megatron.core.checkpointing.reading import check_complete

from .cli import losses, run_cli
from .test_bad_inputs import assert_one_error_line
from .test_save_load_faults import TINY, TRACKER

FOUR = TINY + ["--train-iters", "4", "--save-interval", "1"]


def warnings(stdout):
    return [line for line in stdout.splitlines() if line.startswith("> warning:")]


MODES = {  # name: (processes, flags, fault, the cause in the line)
    # the rank file's write on one process: a full disk
    "sync": (1, [], "ckpt.rank_file.write:2::enospc", "No space left on device (injected at ckpt.rank_file.write)"),
    # rank 1's write fails in the background thread; known at the next save, every rank agreeing
    "async-save": (2, ["--async-save"], "ckpt.rank_file.write:2:1:enospc", "No space left on device"),
    # rank 0's commit (metadata.json) fails after every rank wrote its 1/DP share (full matrix)
    "fully-parallel-save": (2, ["--ckpt-fully-parallel-save"], "ckpt.metadata.before:2::eio",
                            "Input/output error (injected at ckpt.metadata.before)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODES))
def test_a_failed_save_is_one_line_and_training_goes_on(tmp_path, name):
    nproc, flags, fault, cause = MODES[name]
    d = str(tmp_path / "ckpt")
    proc = run_cli(FOUR + flags + ["--save", d], nproc=nproc, check=False, timeout=300,
                   env={"MEGATRON_DEBUG_FAULT": fault})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = warnings(proc.stdout)
    assert len(lines) == 1, lines
    assert f"--save {d}: cannot save iteration 2: {cause}" in lines[0], lines[0]
    assert "iter_0000002.tmp removed, the checkpoint of iteration 1 is still the latest" in lines[0]
    assert "training goes on, the next save interval tries again (1 of 3" in lines[0]
    assert sorted(losses(proc.stdout)) == [1, 2, 3, 4]
    assert sorted(os.listdir(d)) == ["iter_0000001", "iter_0000003", "iter_0000004", TRACKER]
    assert open(os.path.join(d, TRACKER)).read().strip() == "4"
    for it in (1, 3, 4):
        check_complete(iter_dir(d, it), checksums=True)


def test_failures_in_a_row_end_the_run_naming_the_cause(tmp_path):
    d = str(tmp_path / "ckpt")
    proc = run_cli(FOUR + ["--save", d, "--max-consecutive-save-failures", "2"], check=False, timeout=300,
                   env={"MEGATRON_DEBUG_FAULT": "ckpt.rank_file.write:*::enospc"})
    assert_one_error_line(proc, "2 checkpoint saves in a row failed (--max-consecutive-save-failures 2); the last: "
                                f"--save {d}: cannot save iteration 2: No space left on device", ran=True)
    assert len(warnings(proc.stdout)) == 1 and "cannot save iteration 1" in warnings(proc.stdout)[0]
    assert sorted(losses(proc.stdout)) == [1, 2] and os.listdir(d) == []


def test_a_save_failure_limit_below_one_is_one_line(tmp_path):
    proc = run_cli(FOUR + ["--save", str(tmp_path), "--max-consecutive-save-failures", "0"], check=False, timeout=120)
    assert_one_error_line(proc, "--max-consecutive-save-failures must be at least 1")


def test_a_save_failure_limit_without_save_is_accepted_without_effect():
    proc = run_cli(TINY + ["--train-iters", "1", "--max-consecutive-save-failures", "5"])
    assert "--max-consecutive-save-failures (without --save nothing is saved)" in proc.stdout
