"""core/timers.py: Megatron-LM's timer levels, names and reports (one process; the CLI tests run them
over several ranks)."""
import time

import pytest

from megatron.core.pipeline_parallel.actions import Action, Op
from megatron.core.pipeline_parallel.schedules import SCHEDULES
from megatron.core.timers import LEVEL_NAMES, NULL_TIMER, Timers, phase


def test_timers_above_the_level_are_the_shared_no_op():
    timers = Timers(log_level=1)
    assert timers("batch-generator", 2) is NULL_TIMER and phase(None, "optimizer", 1) is NULL_TIMER
    assert timers("optimizer", 1) is timers("optimizer", 1) is not NULL_TIMER
    assert Timers()("forward-backward", 1) is NULL_TIMER  # level 0: nothing is timed
    assert Timers().gather() == {} and Timers().report({}) is None  # and nothing is gathered or printed


def test_elapsed_accumulates_and_gather_normalises_to_ms_per_iteration():
    timers = Timers(log_level=2)
    for _ in range(2):
        with timers("forward-compute", 2):
            time.sleep(0.01)
    times = timers.gather(normalizer=2)
    assert list(times) == ["forward-compute"]  # timers that never ran are left out
    assert 10.0 <= times["forward-compute"][0] < 60.0  # ms per iteration on this (the only) rank
    assert timers.gather(normalizer=2) == {}  # reset by the first gather


def test_names_follow_megatrons_lists_then_the_others():
    timers = Timers(log_level=1)
    timers("my-phase", 1)
    assert timers.names() == list(LEVEL_NAMES[1]) + ["my-phase"]
    assert Timers(log_level=2).names() == list(LEVEL_NAMES[1]) + list(LEVEL_NAMES[2])


DOTS = "optimizer " + "." * 38  # the name padded with dots to 48 characters, as Megatron-LM prints it


@pytest.mark.parametrize("option,expected", [
    ("minmax", f"(min, max) time across ranks (ms):\n    {DOTS}: (1.00, 3.50)"),
    ("max", f"max time across ranks (ms):\n    {DOTS}: 3.50"),
    ("all", "times across ranks (ms):\n  optimizer:\n     rank  0: 1.00\n     rank  2: 3.50"),
])
def test_reports_over_ranks(option, expected):
    # a rank where the timer did not run (0) is left out of every report, as in Megatron-LM
    assert Timers(1, option).report({"optimizer": [1.0, 0.0, 3.5]}) == expected


def test_bad_level_or_option():
    with pytest.raises(ValueError):
        Timers(3)
    with pytest.raises(ValueError):
        Timers(1, "mean")


def _comm(*kinds):
    return Action("comm", ops=tuple(Op(k, 0, 0, 1) for k in kinds))


@pytest.mark.parametrize("kinds,name", [
    (("recv_fwd",), "forward-recv"), (("send_fwd",), "forward-send"), (("recv_bwd",), "backward-recv"),
    (("send_bwd",), "backward-send"), (("send_fwd", "recv_fwd"), "forward-send-forward-recv"),
    (("send_fwd", "recv_bwd"), "forward-send-backward-recv"), (("send_bwd", "recv_fwd"), "backward-send-forward-recv"),
    (("send_bwd", "recv_bwd"), "backward-send-backward-recv"),
    (("send_fwd", "send_bwd"), "forward-backward-send-forward-backward-recv"),
    (("send_fwd", "send_bwd", "recv_fwd", "recv_bwd"), "forward-backward-send-forward-backward-recv"),
])
def test_pipeline_messages_get_megatrons_p2p_timer_names(kinds, name):
    assert _comm(*kinds).timer_name() == name


def test_every_action_of_every_schedule_has_a_level_2_timer():
    for schedule, build in SCHEDULES.items():
        P, V = (1, 1) if schedule == "no_pipelining" else (4, 2 if "interleaved" in schedule else 1)
        for rank in range(P):
            for a in build(P, 8, V, rank, False):
                assert a.timer_name() in LEVEL_NAMES[2], (schedule, a)
    assert Action("F").timer_name() == "forward-compute"
    assert Action("B").timer_name() == Action("W").timer_name() == "backward-compute"
