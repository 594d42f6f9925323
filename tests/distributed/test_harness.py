"""tests/harness.py itself: per-rank return values on the built grid, a failing rank's traceback
reported without hanging, and the timeout."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.harness import spawn


def _rank1_raises(groups):
    if groups.rank == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()  # would wait forever for rank 1
    return groups.rank


def _hangs(groups):
    time.sleep(3600)


def _grid(groups):
    return (groups.rank, groups.tp_rank, groups.dp_rank, groups.pp_rank, torch.get_num_threads())


def _environment(groups):
    return os.environ.get("HARNESS_PROBE")


def test_ranks_see_the_callers_environment_of_the_moment(monkeypatch):
    spawn(1, _grid, timeout=60)  # the fork server is running before the variable is set
    monkeypatch.setenv("HARNESS_PROBE", "now")
    assert spawn(1, _environment, timeout=60) == ["now"]


def test_harness_returns_per_rank_values():
    assert spawn(4, _grid, tp=2, pp=2, timeout=60) == [(0, 0, 0, 0, 1), (1, 1, 0, 0, 1),
                                                       (2, 0, 0, 1, 1), (3, 1, 0, 1, 1)]


def test_harness_reports_failing_rank_without_hanging():
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as info:
        spawn(2, _rank1_raises, tp=2, timeout=60)
    msg = str(info.value)
    assert "rank 1" in msg and "ValueError: boom from rank 1" in msg and "Traceback" in msg, msg
    assert "_rank1_raises" in msg, msg  # the full traceback, down to the raising frame
    assert time.monotonic() - t0 < 45


def test_harness_times_out():
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="timed out"):
        spawn(2, _hangs, timeout=5)
    assert time.monotonic() - t0 < 30
