"""The planner (megatron/training/planner): its memory is the estimator's, its ranking puts what
does not fit last, its calibration agrees with the MFU peaks, its pipeline extrapolation is the
simulation, and tools/plan.py runs end to end."""
import pytest

from megatron.core.pipeline_parallel.schedules import build_schedule
from megatron.core.pipeline_parallel.simulator import simulate, v_stage
from megatron.core.pipeline_parallel.zb_v import zb_v
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.observability.flops import lookup_peak
from megatron.training.planner import activations, load_calibration, make_cluster, memory, pipeline_cost, plan, predict
from megatron.training.planner.predict import PLAN_DEFAULTS
from tools import plan as plan_cli

TOY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
       "--max-position-embeddings", "128", "--vocab-size", "512", "--global-batch-size", "16", "--bf16"]
LAYOUTS = [
    ["--micro-batch-size", "2"],
    ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--micro-batch-size", "1"],
    ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2", "--use-distributed-optimizer"],
    ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
     "--micro-batch-size", "1", "--recompute-granularity", "full"],
    ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "4",
     "--recompute-granularity", "selective"],
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: " ".join(f))
def test_memory_is_the_estimators(layout):
    """The planner's memory per GPU = max over stages of tools/estimate_memory.py's total, parsed
    the way that tool parses its own flags (its parse_args / resolve / validate)."""
    world = 8
    c, t = parse_args(PLAN_DEFAULTS + TOY + layout)
    resolve(c, t, world)
    validate(c, t, world)
    want = max(memory.total_bytes(memory.estimate(c, t, world, r)) for r in range(c.pipeline_model_parallel_size))
    got = predict(TOY + layout, make_cluster("A100-80GB", world)).memory_bytes
    assert got == want


def test_recompute_shrinks_the_estimate():
    totals = {}
    for rec in ([], ["--recompute-granularity", "selective"], ["--recompute-granularity", "full"]):
        c, t = parse_args(PLAN_DEFAULTS + TOY + ["--micro-batch-size", "4"] + rec)
        resolve(c, t, 1)
        totals[tuple(rec)] = memory.total_bytes(memory.estimate(c, t, 1))
    full, sel, none = (totals[k] for k in (("--recompute-granularity", "full"),
                                           ("--recompute-granularity", "selective"), ()))
    assert full < sel < none


def test_ranking_puts_what_does_not_fit_last():
    # 8 GPUs of 2 MB: the toy model fits in some layouts only
    cluster = make_cluster("H100-SXM", 8, memory_gb=0.002)
    preds, _ = plan(TOY, cluster)
    fits = [p.fits for p in preds]
    assert any(fits) and not all(fits)
    assert fits == sorted(fits, reverse=True)  # every fitting layout before every other
    first_bad = fits.index(False)
    assert all(p.memory_bytes > cluster.memory_bytes for p in preds[first_bad:])
    times = [p.step.total for p in preds[:first_bad]]
    assert times == sorted(times)


def test_calibration_peaks_are_the_mfu_table():
    """One source of truth for the peaks: calibration.toml and megatron/training/observability/flops.py agree."""
    names = {"A100-80GB": "A100", "A100-40GB": "A100", "H100-SXM": "H100 SXM", "H200": "H200"}
    for gpu, g in load_calibration()["gpu"].items():
        assert lookup_peak(names[gpu], "bf16")[1] == g["peak_bf16_tflops"]


@pytest.mark.parametrize("schedule", ["1f1b", "zb_h1", "zb_v"])
def test_extrapolated_pipeline_equals_the_simulation(schedule, monkeypatch):
    costs = {0: (1.0, 1.4, 0.8), 1: (1.1, 1.2, 0.8), 2: (1.0, 1.3, 0.7), 3: (1.3, 1.5, 1.0)}

    def cost(rank, a):
        return costs[rank]["FBW".index(a.kind)] if a.kind in ("F", "B", "W") else 0.05

    P, M = 4, 40
    if schedule == "zb_v":
        def build(m):
            return {r: zb_v(P, m, 2, r) for r in range(P)}
        where = dict(stage_of=v_stage, streams=True)
    else:
        def build(m):
            return build_schedule(P, m, 1, schedule)
        where = {}
    direct = simulate(build(M), cost, **where)
    monkeypatch.setattr(pipeline_cost, "_SIM_ACTIONS", 8 * P * 3 * P)  # force the extrapolation
    makespan, bubble = pipeline_cost.simulate_long(build, P, M, cost, **where)
    assert makespan == pytest.approx(direct.makespan, rel=1e-9)
    assert bubble == pytest.approx(direct.bubble, rel=1e-9)


def test_plan_cli(capsys):
    assert plan_cli.main(["--gpu", "A100-40GB", "--num-gpus", "4", "--fix", "recompute=none"] + TOY) == 0
    out = capsys.readouterr().out
    assert "best layout:" in out and "pretrain_gpt.py" in out
    assert plan_cli.main(["--gpu", "Z80"] + TOY) == 2
    assert "--gpu Z80" in capsys.readouterr().err
    assert plan_cli.main(TOY[:-3] + ["--bf16"]) == 2  # no --global-batch-size


def test_training_log_line():
    from megatron.training.planner.live import calibration_gpu, predicted_step_line, prediction_line
    from megatron.training.planner.predict import configs
    assert calibration_gpu("NVIDIA H100 80GB HBM3", 85e9) == "H100-SXM"
    assert calibration_gpu("NVIDIA H100 PCIe", 85e9) is None
    assert calibration_gpu("NVIDIA H200", 150e9) == "H200"
    assert calibration_gpu("NVIDIA A100-SXM4-40GB", 42e9) == "A100-40GB"
    assert calibration_gpu("NVIDIA A100-SXM4-80GB", 85e9) == "A100-80GB"
    c, t = configs(TOY + ["--micro-batch-size", "2"], 8)
    assert predicted_step_line(c, t, 8, "cpu") is None
    line = prediction_line(c, t, 8, "H100-SXM", 8)
    want = predict(TOY + ["--micro-batch-size", "2"], make_cluster("H100-SXM", 8)).step.total
    assert f"predicted {want:.3f} s per iteration" in line


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)])
def test_estimator_recompute_is_korthikanti(tp, sp):
    """The estimator's kept activations with the paper's layer (--attention-backend unfused: the core keeps
    the s x s scores) = Korthikanti et al.'s bytes per layer (tests/activation_memory.korthikanti) x layers,
    without recompute, selective and full; full recompute also rebuilds one layer."""
    from tests.activation_memory import korthikanti
    for rec in (None, "selective", "full"):
        flags = TOY + ["--micro-batch-size", "2", "--tensor-model-parallel-size", str(tp), "--attention-backend",
                       "unfused"] + (["--recompute-granularity", rec] if rec else [])
        flags += ["--sequence-parallel"] if sp else []
        c, t = parse_args(PLAN_DEFAULTS + flags)
        resolve(c, t, tp)
        kept, working = activations.kept_activation_bytes(c, 2, tp, 4)
        s, h, a = c.seq_length, c.hidden_size, c.num_attention_heads
        assert kept == pytest.approx(4 * korthikanti(s, 2, h, a, tp, sp, rec), rel=1e-9)
        assert working == (pytest.approx(korthikanti(s, 2, h, a, tp, sp, None)) if rec == "full" else 0)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "flash", "fused"])
@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)])
def test_estimator_fused_attention_keeps_no_scores(tp, sp, backend):
    """Every fused core (what --attention-backend auto runs on a GPU) keeps Q, K, V and an fp32 log-sum-exp
    instead of the s x s scores: tests/activation_memory.ours(core="sdpa-flash") with the paper's other
    parameters (1-byte masks, no norm statistics), the layer tests/distributed/test_activation_memory.py
    measures; selective recompute drops the log-sum-exp too; full recompute is unchanged."""
    from tests.activation_memory import korthikanti, ours
    for rec in (None, "selective", "full"):
        flags = TOY + ["--micro-batch-size", "2", "--tensor-model-parallel-size", str(tp), "--attention-backend",
                       backend] + (["--recompute-granularity", rec] if rec else [])
        flags += ["--sequence-parallel"] if sp else []
        c, t = parse_args(PLAN_DEFAULTS + flags)
        resolve(c, t, tp)
        kept, _ = activations.kept_activation_bytes(c, 2, tp, 4)
        s, h, a = c.seq_length, c.hidden_size, c.num_attention_heads
        want = ours(s, 2, h, a, tp, sp, rec, core="sdpa-flash") if rec != "selective" else korthikanti(
            s, 2, h, a, tp, sp, rec)
        assert kept == pytest.approx(4 * want, rel=1e-9), rec
        if rec is None:  # the paper's unfused layer keeps 5 a s^2 b / t more, less the log-sum-exp
            assert 4 * korthikanti(s, 2, h, a, tp, sp, None) - kept == pytest.approx(
                4 * (5 * a * s * s * 2 / tp - 4 * a * s * 2 / tp), rel=1e-9)
