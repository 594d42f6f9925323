"""Schedules as data: every schedule, simulated over a grid of (P, M, V), is complete,
deadlock-free and in order; bubbles match theory; the layer split is exact or an error."""
import pytest

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.pipeline_parallel.schedules import (
    SCHEDULES,
    Action,
    Op,
    ScheduleError,
    build_schedule,
    default_schedule,
)
from megatron.core.pipeline_parallel.simulator import (
    ScheduleDeadlock,
    ScheduleMismatch,
    check_complete,
    predicted_bubble,
    simulate,
    uniform_costs,
)
from megatron.core.pipeline_parallel.split import layer_split


def _grid():
    for name in SCHEDULES:
        for P in range(1, 9):
            for M in range(1, 17):
                for V in range(1, 4):
                    try:
                        build_schedule(P, M, V, name)
                    except ScheduleError:
                        continue
                    yield name, P, M, V


def test_every_schedule_is_complete_deadlock_free_and_in_order():
    checked = dict.fromkeys(SCHEDULES, 0)
    for name, P, M, V in _grid():
        for forward_only in (False, True):
            actions = build_schedule(P, M, V, name, forward_only)
            check_complete(actions, M, V, forward_only)
            t = simulate(actions, uniform_costs(1.0, 2.0, 0.01, V))  # raises on deadlock / mismatch
            if name == "1f1b" and not forward_only:
                assert max(t.peak_in_flight.values()) <= P, (P, M, t.peak_in_flight)
                assert all(t.peak_in_flight[r] <= min(P - r, M) for r in range(P))
            checked[name] += 1
    # the grid really covered each schedule (P = 1..8, M = 1..16, V = 1..3 where valid)
    assert checked["no_pipelining"] == 2 * 16 and checked["1f1b"] == 2 * 8 * 16
    assert checked["interleaved_1f1b"] == 2 * 2 * sum(16 // P for P in range(2, 9))
    assert checked["gpipe"] == 2 * (8 * 16 + 2 * sum(16 // P for P in range(2, 9)))


@pytest.mark.parametrize("P,M,V", [(2, 4, 1), (4, 8, 1), (8, 3, 1), (2, 4, 2), (4, 8, 2), (4, 16, 3), (8, 8, 2)])
def test_bubble_matches_theory_with_free_communication(P, M, V):
    name = default_schedule(P, V)
    t = simulate(build_schedule(P, M, V, name), uniform_costs(1.0, 2.0, 0.0, V))
    for r in range(P):  # every rank idles the same (P - 1) / (V M + P - 1)
        assert t.idle_fraction(r) == pytest.approx(predicted_bubble(P, M, V), abs=1e-12)
    assert t.makespan == pytest.approx(3.0 * (M + (P - 1) / V))
    if V == 1:  # GPipe has the same bubble but holds all M microbatches
        g = simulate(build_schedule(P, M, 1, "gpipe"), uniform_costs(1.0, 2.0, 0.0))
        assert g.bubble == pytest.approx(t.bubble) and g.peak_in_flight[0] == M


def test_interleaving_trades_memory_for_bubble():
    one = simulate(build_schedule(4, 8, 1), uniform_costs(V=1))
    two = simulate(build_schedule(4, 8, 2), uniform_costs(V=2))
    assert two.bubble < one.bubble
    assert two.peak_in_flight[0] > one.peak_in_flight[0]  # counted in chunk-microbatches


def test_1f1b_rank0_actions_read_like_the_paper():
    acts = build_schedule(2, 3, 1, "1f1b")[0]
    assert [repr(a) for a in acts if a.kind != "comm"] == [
        "F[0,0]", "F[0,1]", "B[0,0]", "F[0,2]", "B[0,1]", "B[0,2]"]
    assert acts[1] == Action("comm", ops=(Op("send_fwd", 0, 0, 1),))


def test_simulator_catches_deadlock_and_mismatched_order():
    # both ranks wait to receive first: deadlock
    dead = {0: [Action("comm", ops=(Op("recv_bwd", 0, 0, 1),)), Action("comm", ops=(Op("send_fwd", 0, 0, 1),))],
            1: [Action("comm", ops=(Op("recv_fwd", 0, 0, 0),)), Action("comm", ops=(Op("send_bwd", 0, 0, 0),))]}
    with pytest.raises(ScheduleDeadlock, match="rank 0 at action 0"):
        simulate(dead)
    # rank 0 sends microbatches 0, 1; rank 1 expects 1 first
    swapped = {0: [Action("comm", ops=(Op("send_fwd", 0, 0, 1), Op("send_fwd", 0, 1, 1)))],
               1: [Action("comm", ops=(Op("recv_fwd", 0, 1, 0), Op("recv_fwd", 0, 0, 0)))]}
    with pytest.raises(ScheduleMismatch, match="channel 0->1"):
        simulate(swapped)
    # a send nobody receives
    with pytest.raises((ScheduleMismatch, ScheduleDeadlock)):
        simulate({0: [Action("comm", ops=(Op("send_fwd", 0, 0, 1),))], 1: []})


def test_schedules_reject_what_they_cannot_run():
    with pytest.raises(ScheduleError, match="multiple of P"):
        build_schedule(4, 6, 2, "interleaved_1f1b")
    with pytest.raises(ScheduleError):
        build_schedule(2, 4, 2, "1f1b")
    with pytest.raises(ScheduleError):
        build_schedule(2, 4, 1, "no_pipelining")


def test_layer_split_even_uneven_and_interleaved():
    assert layer_split(8, 2) == [[(0, 4)], [(4, 4)]]
    assert layer_split(8, 2, 2) == [[(0, 2), (4, 2)], [(2, 2), (6, 2)]]
    assert layer_split(7, 3, None, 1, 2) == [[(0, 1)], [(1, 4)], [(5, 2)]]
    assert layer_split(6, 3, None, 2) == [[(0, 2)], [(2, 2)], [(4, 2)]]
    assert layer_split(8, 2, 2, 2, 6) == [[(0, 1), (4, 1)], [(1, 3), (5, 3)]]
    # every layer exactly once, in order
    for split in (layer_split(12, 4, 3), layer_split(10, 4, None, 1, 3)):
        spans = sorted(c for stage in split for c in stage)
        assert [o for o, _ in spans] == [sum(n for _, n in spans[:i]) for i in range(len(spans))]
        assert sum(n for _, n in spans) == spans[-1][0] + spans[-1][1]


@pytest.mark.parametrize("kw,message", [
    (dict(num_layers=3, pipeline_model_parallel_size=2),
     "--num-layers (3) is not divisible by --pipeline-model-parallel-size (2)"),
    (dict(num_layers=4, pipeline_model_parallel_size=3, decoder_first_pipeline_num_layers=1),
     "leaves 3 layers, which do not divide evenly over the other 2"),
    (dict(num_layers=4, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=3),
     "2 layers per stage is not divisible by --num-layers-per-virtual-pipeline-stage (3)"),
    (dict(num_layers=6, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2),
     "has 3 layers, which do not divide into 2 model chunks"),
    (dict(num_layers=4, pipeline_model_parallel_size=1, num_layers_per_virtual_pipeline_stage=2),
     "needs --pipeline-model-parallel-size of at least 2"),
    (dict(num_layers=4, decoder_last_pipeline_num_layers=2), "need --pipeline-model-parallel-size of at least 2"),
])
def test_bad_pipeline_layouts_name_the_flags(kw, message):
    cfg = TransformerConfig(hidden_size=64, num_attention_heads=4, **kw)
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    assert message in str(info.value), str(info.value)


def test_layers_per_virtual_stage_sets_chunks_per_rank():
    cfg = TransformerConfig(num_layers=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=2)
    cfg.resolve().validate()
    assert cfg.virtual_pipeline_model_parallel_size == 2
    cfg = TransformerConfig(num_layers=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=4)
    cfg.resolve().validate()
    assert cfg.virtual_pipeline_model_parallel_size is None  # one chunk per rank: plain 1F1B


def test_timeline_tool_draws_svg_and_prints_bubble(tmp_path, capsys):
    import importlib.util
    import json
    import os
    import xml.etree.ElementTree as ET
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "pipeline_timeline.py")
    spec = importlib.util.spec_from_file_location("pipeline_timeline", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "il.svg"
    tool.main(["--schedule", "interleaved_1f1b", "--pp", "4", "--microbatches", "8", "--vpp", "2", "-o", str(out)])
    printed = capsys.readouterr().out
    assert "bubble (mean idle fraction): 15.79%" in printed and "rank 3: idle 15.79%" in printed
    svg = ET.parse(out).getroot()  # well-formed
    boxes = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect")
             if e.find("{http://www.w3.org/2000/svg}title") is not None]
    assert len(boxes) == 4 * 2 * 8 * 2  # ranks x chunks x microbatches x (F, B)
    # a recorded trace goes through the same drawing
    trace = {"schedule": "1f1b", "P": 2, "M": 1, "V": 1,
             "ranks": {"0": [["F", 0, 0, 0.0, 1.0], ["comm", 0, 0, 1.0, 1.5], ["B", 0, 0, 4.5, 6.5]],
                       "1": [["F", 0, 0, 1.5, 2.5], ["B", 0, 0, 2.5, 4.5]]}}
    (tmp_path / "t.json").write_text(json.dumps(trace))
    tool.main(["--trace", str(tmp_path / "t.json"), "-o", str(tmp_path / "t.svg")])
    printed = capsys.readouterr().out
    assert "rank 0: idle 53.85%" in printed and "rank 1: idle 53.85%" in printed
