"""The planner's ZeRO-3, context-parallel and expert-parallel bytes against their closed forms."""
import dataclasses

import pytest

from megatron.training.planner.cost import dp_traffic
from megatron.training.planner.predict import configs, estimator

BASE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64", "--vocab-size", "128", "--bf16"]


@pytest.mark.parametrize("recompute", [None, "full"])
def test_zero3_dp_bytes_equal_formula(recompute):
    """ZeRO-3 per step: 3 P (d-1)/d, plus 2 P (d-1)/d per further microbatch (one more gather per
    microbatch under full recompute); P the full parameter bytes, the gradients fp32 (docs/zero.md)."""
    d, micro = 4, 3
    flags = BASE + ["--global-batch-size", str(d * micro), "--micro-batch-size", "1",
                    "--use-distributed-optimizer", "--data-parallel-sharding-strategy", "optim_grads_params"]
    flags += ["--recompute-granularity", recompute] if recompute else []
    c, t = configs(flags, d)
    mem = estimator().estimate(c, t, d)
    params = mem["params"] * d  # the estimator holds the shard; its buffers are padded to d
    traffic = dp_traffic(mem, d, True, "optim_grads_params", micro, recompute == "full")
    gathers = (3 if recompute else 2) * micro
    assert traffic["dp-params"] == gathers * params * (d - 1) / d
    assert traffic["dp-grads"] == 2 * params * (d - 1) / d  # fp32 grads: twice the bf16 parameter bytes
    if not recompute:  # the docs' figure, in elements: 3 P (d-1)/d for the first microbatch, 2 per further one
        elements = traffic["dp-params"] / 2 + traffic["dp-grads"] / 4
        assert elements == (3 + 2 * (micro - 1)) * params / 2 * (d - 1) / d


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_context_parallel_bytes_equal_formula(comm):
    """Ring attention per rank and layer: forward (C-1) u, backward (C-1) u + C u (all_gather: (C-1) u
    both ways), u = 2 (s/C) b (g/tp) d x bytes; and the planner's TP and pipeline messages carry s/C."""
    from megatron.training.planner.traffic import context_parallel_bytes, p2p_message_bytes
    C, tp, b = 4, 2, 2
    flags = BASE + ["--global-batch-size", "8", "--micro-batch-size", str(b), "--attention-dropout", "0",
                    "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", "2",
                    "--context-parallel-size", str(C), "--cp-comm-type", comm,
                    "--group-query-attention", "--num-query-groups", "2"]
    c, _ = configs(flags, 2 * tp * C)
    u = 2 * (64 // C) * b * (2 // tp) * (64 // 4) * 2
    fwd, bwd = context_parallel_bytes(c, b, tp)
    assert (fwd, bwd) == ((C - 1) * u, (C - 1) * u + (C * u if comm == "p2p" else 0))
    assert p2p_message_bytes(c, b, tp) == 64 // C * b * 64 * 2


@pytest.mark.parametrize("tp,groups", [(1, 2), (2, 2), (2, 4)])
def test_ulysses_bytes_are_what_its_all_to_alls_send(tp, groups, monkeypatch):
    """--cp-comm-type a2a per rank and layer: the planner's bytes equal what a2a_attention's
    all-to-alls send, (C-1)/C of each tensor, forward (q, k, v, the output) and backward (their
    gradients). At TP2 with 2 query groups one K/V group per TP rank does not split C = 2 ways:
    it goes as one copy per query head. The collective is replaced by a copy on a stand-in group."""
    import torch

    from megatron.core.comm import PlanGroup
    from megatron.core.transformer import context_parallel
    from megatron.training.planner.traffic import context_parallel_bytes, ulysses_sent_bytes
    C, b, heads, d = 2, 2, 4, 16
    flags = BASE + ["--global-batch-size", "8", "--micro-batch-size", str(b), "--attention-dropout", "0",
                    "--tensor-model-parallel-size", str(tp), "--context-parallel-size", str(C),
                    "--cp-comm-type", "a2a", "--group-query-attention", "--num-query-groups", str(groups)]
    c, _ = configs(flags, tp * C)
    assert c.kv_channels == d
    sent = []

    def copy(out, x, group=None):
        sent.append(x.numel() * x.element_size() * (C - 1) / C)
        out.copy_(x)
    monkeypatch.setattr(context_parallel.dist, "all_to_all_single", copy)
    s = 64 // C  # this rank's tokens; bf16 as the flags say
    q = torch.randn(s, b, heads // tp, d, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(s, b, groups // tp, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = context_parallel.a2a_attention(q, k, v, PlanGroup(C, 0))
    forward = sum(sent)
    out.float().sum().backward()
    backward = sum(sent) - forward
    assert len(sent) == 8 and sorted(sent[:4]) == sorted(ulysses_sent_bytes(c, b, tp))
    assert context_parallel_bytes(c, b, tp) == (forward, backward)


def test_expert_parallel_bytes_equal_formula():
    """All-to-all per step (bench/moe.py): 4 h x bytes x remote pairs, remote pairs = T k (EP-1)/EP
    per MoE layer and microbatch under even routing; T = the CP rank's tokens."""
    from megatron.training.planner.moe_cost import expert_parallel_bytes, iteration_expert_parallel_bytes
    ep, cp, dp, b, k = 4, 2, 4, 2, 2
    flags = BASE + ["--global-batch-size", "16", "--micro-batch-size", str(b), "--attention-dropout", "0",
                    "--num-experts", "8", "--moe-router-topk", str(k), "--moe-layer-freq", "2",
                    "--expert-model-parallel-size", str(ep), "--moe-token-dispatcher-type", "alltoall",
                    "--context-parallel-size", str(cp)]
    c, t = configs(flags, dp * cp)
    pairs = 64 // cp * b * k * (ep - 1) / ep
    assert sum(expert_parallel_bytes(c, b)) == 4 * 64 * 2 * pairs
    micro = 16 // (b * dp)
    assert iteration_expert_parallel_bytes(c, t, dp, 2) == micro * 2 * 4 * 64 * 2 * pairs

MOE = ["--num-experts", "4", "--moe-ffn-hidden-size", "32", "--moe-router-topk", "2", "--moe-token-dispatcher-type",
       "alltoall"]


def _dense_and_expert_elements(c):
    """(P, E): a rank's dense and (its EP rank's) expert parameter elements, from the model itself."""
    from megatron.core.tensor_parallel.param_meta import is_expert_parallel
    params, _ = estimator().stage_params(c, 0)
    E = sum(p.numel() for p in params if is_expert_parallel(p))
    return sum(p.numel() for p in params) - E, E


@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
@pytest.mark.parametrize("ep,cp", [(2, 1), (2, 2), (4, 1)], ids=["ep2-e2", "cp2ep2-e2", "ep4-e1"])
def test_expert_dp_bytes_equal_formula(strategy, ep, cp):
    """MoE under ZeRO-2/3 (docs/zero.md, tests/distributed/test_zero_moe_sharding.py): the dense
    buffers are sharded over d = DP x CP, the experts over e = d / EP. One microbatch per step moves, in
    elements per rank, ZeRO-3: 3 (P (d-1)/d + E (e-1)/e) (two parameter gathers, one gradient
    reduce-scatter); ZeRO-2: 2 (P (d-1)/d + E (e-1)/e) (one reduce-scatter, one gather after the
    step); e = 1 moves nothing for the experts. Held per rank: P/d + E/e of every sharded state."""
    d = 4
    e = d // ep
    flags = BASE + MOE + ["--global-batch-size", str(d // cp), "--micro-batch-size", "1", "--attention-dropout", "0",
                          "--expert-model-parallel-size", str(ep), "--context-parallel-size", str(cp),
                          "--use-distributed-optimizer", "--data-parallel-sharding-strategy", strategy]
    c, t = configs(flags, d)
    P, E = _dense_and_expert_elements(c)
    assert P % d == 0 and E % d == 0 and E > 0  # no padding: the buffers are exactly P and E elements
    mem = estimator().estimate(c, t, d)
    assert mem["grads"] == 4 * (P // d + E // e)  # fp32 gradient shards
    assert mem["params"] == 2 * ((P // d + E // e) if strategy == "optim_grads_params" else P + E)
    traffic = dp_traffic(mem, d, True, strategy, 1)
    moved = P * (d - 1) / d + E * (e - 1) / e
    assert traffic["dp-grads"] == 4 * moved  # fp32 reduce-scatter
    assert traffic["dp-params"] == 2 * (2 if strategy == "optim_grads_params" else 1) * moved  # bf16 gathers
    elements = traffic["dp-params"] / 2 + traffic["dp-grads"] / 4
    assert elements == (3 if strategy == "optim_grads_params" else 2) * moved


def test_layout_search_offers_zero23_with_expert_parallel():
    """The planner's ZeRO dimension offers ZeRO-2 and ZeRO-3 at EP > 1 (ZeRO-1 too with --search full),
    and such a layout is predicted end to end."""
    from megatron.training.planner import make_cluster, predict
    from megatron.training.planner.layouts import Space, enumerate_layouts
    space = Space(8, 8, 4, 4, 4, 16, False, 64, num_experts=4)
    fixed = {"tp": 1, "pp": 1, "mb": 1, "recompute": None, "dist_opt": True}
    offered = {(lay["ep"], lay["zero"]) for lay in enumerate_layouts(space, fixed)}
    assert {(2, "optim_grads"), (4, "optim_grads_params")} <= offered and (2, "optim") not in offered
    full = {lay["zero"] for lay in enumerate_layouts(dataclasses.replace(space, full=True), fixed) if lay["ep"] == 4}
    assert full == {"optim", "optim_grads", "optim_grads_params"}
    flags = BASE + MOE + ["--global-batch-size", "16", "--micro-batch-size", "1", "--expert-model-parallel-size", "2",
                          "--use-distributed-optimizer", "--data-parallel-sharding-strategy"]
    cluster = make_cluster("H100-SXM", 8)
    z3, z1 = (predict(flags + [zero], cluster) for zero in ("optim_grads_params", "optim"))
    assert z3.memory_bytes < z1.memory_bytes and z3.step.dp_exposed > z1.step.dp_exposed > 0
