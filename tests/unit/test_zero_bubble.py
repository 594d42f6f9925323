"""Zero-bubble schedules (zero_bubble.py) on paper: complete, deadlock-free and in order over
the grid of the other schedules; bubbles equal the paper's analytic ones; memory as claimed."""
import pytest

from megatron.core.pipeline_parallel.schedules import build_schedule
from megatron.core.pipeline_parallel.simulator import check_complete, fbw_costs, simulate
from megatron.core.pipeline_parallel.zero_bubble import compute_order

ZB = ("zb_h1", "zb_h2")


@pytest.mark.parametrize("name", ZB)
def test_zero_bubble_schedules_are_complete_and_deadlock_free(name):
    for P in range(1, 9):
        for M in range(1, 17):
            for forward_only in (False, True):
                actions = build_schedule(P, M, 1, name, forward_only)
                check_complete(actions, M, 1, forward_only)
                for costs in ((1.0, 1.0, 1.0, 0.01), (1.0, 2.0, 0.5, 0.3)):  # raises on deadlock / mismatch
                    t = simulate(actions, fbw_costs(*costs))
                if not forward_only:
                    limit = P if name == "zb_h1" else 2 * P - 1
                    assert max(t.peak_in_flight.values()) <= min(limit, M), (name, P, M, t.peak_in_flight)


# F:B:W ratios; the paper's schedules assume B >= W (else ZB-H1's W's cannot all hide)
RATIOS = [(1, 1, 1), (1, 2, 1), (1, 1, 0.5), (2, 2, 1), (1, 1.5, 0.5), (1, 2, 0.5), (3, 3, 1), (1, 1, 2)]


@pytest.mark.parametrize("F,B,W", RATIOS)
def test_bubble_equals_the_papers_analytic_bubble(F, B, W):
    """p = 8, m = 24, free communication. Idle time per rank and iteration:
    1F1B (p-1)(F+B+W); ZB-H1 (p-1)(F+B-W) (B >= W); ZB-H2 (p-1)(F+B-2W) when positive,
    else 0, between iterations that overlap (steady_idle), and max of that and the last
    stage's start-up (p-1)F within one flushed iteration."""
    P, M = 8, 24
    work = M * (F + B + W)

    def run(name):
        t = simulate(build_schedule(P, M, 1, name), fbw_costs(F, B, W, split=name in ZB))
        assert all(t.busy(r) == pytest.approx(work) for r in range(P))
        return t

    base, h1, h2 = run("1f1b"), run("zb_h1"), run("zb_h2")
    assert base.makespan - work == pytest.approx((P - 1) * (F + B + W))
    if B >= W:
        assert h1.makespan - work == pytest.approx((P - 1) * (F + B - W))
        assert h1.steady_idle == pytest.approx((P - 1) * (F + B - W))
    assert h2.steady_idle == pytest.approx(max(0.0, (P - 1) * (F + B - 2 * W)))
    assert h2.makespan - work == pytest.approx(max((P - 1) * F, (P - 1) * (F + B - 2 * W)))


def test_zb_h1_keeps_1f1b_peak_memory_and_zb_h2_about_doubles_it():
    P, M = 8, 24
    one = simulate(build_schedule(P, M, 1, "1f1b")).peak_in_flight
    h1 = simulate(build_schedule(P, M, 1, "zb_h1"), fbw_costs(1, 1, 1)).peak_in_flight
    h2 = simulate(build_schedule(P, M, 1, "zb_h2"), fbw_costs(1, 1, 1)).peak_in_flight
    # microbatches whose activations a rank holds (until W): 1F1B's worst rank, on every rank
    assert max(one.values()) == P and all(h1[r] == P for r in range(P))
    assert all(h2[r] == 2 * P - 1 for r in range(P))


def test_compute_order_reads_like_the_paper():
    # ZB-H1, p = 4: the last stage holds its W's back by 3 B's, the first runs F B W
    assert " ".join(k + str(m) for k, m in compute_order(4, 6, 3, 0, 3)) == \
        "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5"
    assert " ".join(k + str(m) for k, m in compute_order(4, 6, 0, 3, 0)) == \
        "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5"


def test_zb_v_is_complete_and_deadlock_free_with_one_channel_per_direction():
    """ZB-V (schedule data and simulator only): the V layout's messages, activations and
    gradients each in order on their own channel; the unit-cost bubble below ZB-H1's."""
    from megatron.core.pipeline_parallel.simulator import v_stage
    from megatron.core.pipeline_parallel.zb_v import zb_v
    for P in range(2, 9):
        for M in range(1, 17):
            for forward_only, ratio in ((False, (1, 1, 1)), (True, (1, 1, 1)), (False, (1, 2, 0.5))):
                actions = {r: zb_v(P, M, 2, r, forward_only, ratio) for r in range(P)}
                check_complete(actions, M, 2, forward_only)
                simulate(actions, fbw_costs(1.0, 2.0, 0.5, 0.3, V=2), stage_of=v_stage, streams=True)
    P, M = 8, 24
    v = simulate({r: zb_v(P, M, 2, r) for r in range(P)}, fbw_costs(1, 1, 1, V=2), stage_of=v_stage, streams=True)
    h1 = simulate(build_schedule(P, M, 1, "zb_h1"), fbw_costs(1, 1, 1))
    assert v.makespan - M * 3 == pytest.approx(3.5) and v.bubble < h1.bubble / 1.5
    assert max(v.peak_in_flight.values()) == 2 * P  # chunk-microbatches, half a stage each: 1F1B's peak


def test_timeline_tool_draws_w(tmp_path, capsys):
    import importlib.util
    import os
    import xml.etree.ElementTree as ET
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "pipeline_timeline.py")
    spec = importlib.util.spec_from_file_location("pipeline_timeline", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "zb.svg"
    tool.main(["--schedule", "zb_h1", "--pp", "4", "--microbatches", "8", "-o", str(out)])
    printed = capsys.readouterr().out
    assert "bubble (mean idle fraction): 11.11%" in printed  # (P-1)/(3M+P-1) with F = B = W
    titles = [e.find("{http://www.w3.org/2000/svg}title").text for e in ET.parse(out).getroot().iter()
              if e.find("{http://www.w3.org/2000/svg}title") is not None]
    assert len(titles) == 4 * 8 * 3 and sum(t.startswith("W ") for t in titles) == 4 * 8


def test_pipeline_schedule_flag_maps_to_schedules_and_names_the_fix():
    from megatron.core.config import ConfigError
    from megatron.core.pipeline_parallel.schedule_flag import schedule_for_flag
    assert schedule_for_flag(None, 4, 1) == "1f1b" and schedule_for_flag(None, 4, 2) == "interleaved_1f1b"
    assert schedule_for_flag("zb-h1", 4, 1) == "zb_h1" and schedule_for_flag("zb-h2", 2, 1) == "zb_h2"
    assert schedule_for_flag("1f1b", 1, 1) == "no_pipelining"  # one stage: gradient accumulation
    assert schedule_for_flag("zb-v", 4, 2) == "zb_v"  # the V layout: pipeline_parallel/split.py
    for flag, V, message in (("zb-h1", 2, "runs one model chunk per rank"), ("interleaved", 1, "more than one model")):
        with pytest.raises(ConfigError, match=message):
            schedule_for_flag(flag, 4, V)
    for flag in ("zb-h1", "zb-h2", "zb-v"):  # one stage: nothing to fill, the flag would do nothing
        with pytest.raises(ConfigError, match=f"--pipeline-schedule {flag} needs --pipeline-model-parallel-size 2"):
            schedule_for_flag(flag, 1, 1)
