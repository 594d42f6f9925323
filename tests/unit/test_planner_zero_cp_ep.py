"""The planner's ZeRO-3, context-parallel and expert-parallel bytes against their closed forms."""
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
