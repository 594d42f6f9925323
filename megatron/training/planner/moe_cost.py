"""MoE layers on paper: expert GEMMs, the router and the token all-to-all over the EP group.

An MoE layer replaces the dense MLP: per rank, T = (s / C) b tokens (replicated over TP) pick k of E
experts; with even routing each of the E / EP local experts gets T k EP / E rows, split over TP like
the dense MLP (expert TP = TP). The all-to-all dispatcher (--moe-token-dispatcher-type alltoall)
sends each (token, choice) pair bound for another EP rank there and back, forward and backward:
4 h x bytes x T k (EP-1)/EP per layer and microbatch (bench/moe.py's formula). Layers alternate
dense / MoE by --moe-layer-freq; cost.py weighs the two by the fraction of MoE layers.
"""
from .hardware import Cluster, all_to_all_time, gemm_time
from .traffic import element_bytes


def moe_fraction(c) -> float:
    """Fraction of the model's layers that are MoE layers (0 for a dense model)."""
    if c.num_experts is None:
        return 0.0
    return sum(c.is_moe_layer(n) for n in range(1, c.num_layers + 1)) / c.num_layers



def expert_parallel_bytes(c, b) -> tuple[float, float]:
    """(forward, backward) bytes one rank sends over its EP group in one MoE layer on a microbatch
    of b samples, even routing: dispatch + combine, each T k (EP-1)/EP rows of h elements."""
    ep = c.expert_model_parallel_size
    pairs = c.seq_length // c.context_parallel_size * b * c.moe_router_topk * (ep - 1) / ep
    one_way = 2 * c.hidden_size * element_bytes(c) * pairs
    return one_way, one_way


def iteration_expert_parallel_bytes(c, t, dp, moe_layers) -> float:
    """Bytes one rank sends over its EP group in one iteration: every microbatch through the
    stage's moe_layers MoE layers, forward and backward (full recompute dispatches again)."""
    micro = t.global_batch_size // (t.micro_batch_size * dp)
    fwd, bwd = expert_parallel_bytes(c, t.micro_batch_size)
    again = fwd if c.recompute_granularity == "full" else 0.0
    return micro * moe_layers * (fwd + bwd + again)


def router_time(c, tokens, cluster: Cluster) -> float:
    """Seconds of the router's [T, h] x [h, E] GEMM (replicated, in the model's precision even with FP8)."""
    return gemm_time(cluster, tokens, c.num_experts, c.hidden_size)


def moe_mlp_costs(c, tokens, cluster: Cluster, tp) -> tuple[float, float]:
    """(GEMM seconds, streamed bytes) of one MoE layer's forward for `tokens` tokens on one rank:
    router [T, h] x [h, E], the local experts' fc1 / fc2 at T k EP / E rows each, the shared
    experts as a dense MLP; bytes: the activation of the expert rows and the permutation copies."""
    E, k, ep, h = c.num_experts, c.moe_router_topk, c.expert_model_parallel_size, c.hidden_size
    f, mats, elt = c.expert_ffn_hidden_size, (2 if c.swiglu else 1), element_bytes(c)
    rows = max(1, tokens * k * ep // E)
    local = E // ep
    gemms = router_time(c, tokens, cluster)
    gemms += local * (gemm_time(cluster, rows, mats * f // tp, h) + gemm_time(cluster, rows, h, f // tp))
    shared = c.moe_shared_expert_intermediate_size or 0
    if shared:
        gemms += gemm_time(cluster, tokens, mats * shared // tp, h) + gemm_time(cluster, tokens, h, shared // tp)
    stream = elt * ((mats + 1) * tokens * k * f / tp + 2 * 2 * tokens * k * h)
    return gemms, stream


def expert_parallel_time(c, b, cluster: Cluster, layout) -> tuple[float, float]:
    """(forward s, backward s) of one MoE layer's all-to-alls over the EP group of `layout` (ParallelLayout:
    its ranks expert-TP apart)."""
    ep, apart = layout.ep, layout.stride("ep")
    if ep == 1:
        return 0.0, 0.0
    fwd, bwd = expert_parallel_bytes(c, b)
    # dispatch and combine are two all-to-alls, each half the bytes
    return (2 * all_to_all_time(cluster, fwd / 2, ep, apart), 2 * all_to_all_time(cluster, bwd / 2, ep, apart))
