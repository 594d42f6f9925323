"""The planner costs the pipeline schedule training runs (--pipeline-schedule) with the schedule
simulator, F, B and W apart (planner/pipeline_cost.py): at PP 4 and 8 microbatches ZB-H1's bubble is
below 1F1B's and ZB-H2's at most ZB-H1's, each is what the simulator reports for that schedule's
action lists with the per-chunk costs written out here, and the training log's line prints it."""
import pytest

from megatron.core.parallel_layout import ParallelLayout
from megatron.core.pipeline_parallel.schedules import build_schedule
from megatron.core.pipeline_parallel.simulator import simulate, v_stage
from megatron.core.pipeline_parallel.zb_v import zb_v
from megatron.training.planner import make_cluster, predict
from megatron.training.planner.cost import embedding_costs, head_costs, layer_costs
from megatron.training.planner.hardware import gemm_time, p2p_time
from megatron.training.planner.live import prediction_line
from megatron.training.planner.predict import configs
from megatron.training.planner.traffic import p2p_message_bytes

ONE = ParallelLayout(1)  # one rank: the cost functions' layout for a single GPU

P, M = 4, 8
FLAGS = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
         "--max-position-embeddings", "2048", "--vocab-size", "32000", "--micro-batch-size", "1",
         "--global-batch-size", str(M), "--bf16", "--pipeline-model-parallel-size", str(P)]
SCHEDULES = {"1f1b": "1f1b", "zb-h1": "zb_h1", "zb-h2": "zb_h2", "zb-v": "zb_v"}


def _simulated(flag):
    """The simulator's (makespan, bubble) for the schedule, costed here from the planner's PassCosts:
    rank r holds 8 / P layers (ZB-V: one layer per chunk), the embedding on the first chunk, the head
    on the last (ZB-V: both on rank 0); W actions take the weight share of B."""
    c, t = configs(FLAGS + ["--pipeline-schedule", flag], P)
    cluster = make_cluster("H100-SXM", P)
    layer, head, emb = (f(c, 1, cluster, ONE) for f in (layer_costs, head_costs, embedding_costs))
    split = flag.startswith("zb")
    v = flag == "zb-v"
    per_chunk = 1 if v else 8 // P

    def part(p, kind):
        whole = p.forward if kind == "F" else p.backward + p.recompute
        w = p.weight if split else 0.0
        return {"F": whole, "B": whole - w, "W": w}[kind]

    def cost(rank, a):
        if a.kind == "comm":
            n_send = sum(op.kind.startswith("send") for op in a.ops)
            return p2p_time(cluster, p2p_message_bytes(c, 1, 1), False) * max(n_send, len(a.ops) - n_send)
        first = rank == 0 and a.chunk == 0
        last = (rank == 0 and a.chunk == 1) if v else rank == P - 1
        return (per_chunk * part(layer, a.kind) + (part(emb, a.kind) if first else 0.0)
                + (part(head, a.kind) if last else 0.0))

    if v:
        tl = simulate({r: zb_v(P, M, 2, r) for r in range(P)}, cost, stage_of=v_stage, streams=True)
    else:
        tl = simulate(build_schedule(P, M, 1, SCHEDULES[flag]), cost)
    return tl.makespan, tl.bubble


@pytest.fixture(scope="module")
def predicted():
    return {flag: predict(FLAGS + ["--pipeline-schedule", flag], make_cluster("H100-SXM", P))
            for flag in SCHEDULES}


def test_zero_bubble_schedules_predict_their_own_smaller_bubble(predicted):
    bubble = {flag: p.step.bubble for flag, p in predicted.items()}
    print({flag: f"{100 * b:.2f}%" for flag, b in bubble.items()})
    assert bubble["zb-h1"] < bubble["1f1b"] and bubble["zb-h2"] <= bubble["zb-h1"]
    assert predicted["zb-h1"].step.total < predicted["1f1b"].step.total
    for flag, p in predicted.items():
        assert p.step.schedule == SCHEDULES[flag]
        makespan, sim_bubble = _simulated(flag)
        assert p.step.pipeline == pytest.approx(makespan, rel=1e-12), flag
        assert p.step.bubble == pytest.approx(sim_bubble, rel=1e-12), flag


def test_w_is_the_weight_gradient_gemms_share_of_the_backward():
    """W of a layer: its four weights' GEMMs (QKV, projection, fc1, fc2 of this dense model, ffn = 4h),
    each as long as in forward; of the head: the output weight's GEMM; of the embedding: all of its
    backward at TP 1 (the table's gradient; no collective)."""
    c, _ = configs(FLAGS, P)
    cluster = make_cluster("H100-SXM", P)
    layer, head, emb = (f(c, 1, cluster, ONE) for f in (layer_costs, head_costs, embedding_costs))
    m, h = c.seq_length, c.hidden_size
    gemms = sum(gemm_time(cluster, m, n, k) for n, k in ((3 * h, h), (h, h), (4 * h, h), (h, 4 * h)))
    assert layer.weight == pytest.approx(gemms, rel=1e-12) and layer.weight < layer.backward / 2
    assert head.weight == pytest.approx(gemm_time(cluster, m, c.padded_vocab_size, h), rel=1e-12)
    assert 0 < head.weight < head.backward and emb.weight == emb.backward > 0


def test_the_training_log_line_shows_the_schedules_own_bubble(predicted):
    lines = {}
    for flag in SCHEDULES:
        c, t = configs(FLAGS + ["--pipeline-schedule", flag], P)
        lines[flag] = prediction_line(c, t, P, "H100-SXM", P)
        want = predicted[flag].step
        assert f"({want.schedule} bubble {100 * want.bubble:.1f}%)" in lines[flag], lines[flag]
    assert len(set(lines.values())) == len(lines)
