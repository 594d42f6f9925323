"""Step time of one layout on paper (docs/planner.md has the equations).

Per microbatch and GPU: GEMMs from their FLOPs and the calibrated efficiency of their shape;
norms, dropout, GeLU, softmax and the optimizer from the bytes they stream through HBM; TP/SP
collectives and pipeline sends from their bytes and the link they cross. The per-chunk forward,
input-gradient and weight-gradient times feed the schedule training runs through the simulator
(pipeline_cost.py), whose makespan holds the bubble; DP gradient (and parameter) collectives are
added after it, minus what --overlap-grad-reduce hides behind the last backward.
"""
import dataclasses
from typing import NamedTuple

from ...core.distributed.strategy import shards_grads, shards_optimizer, shards_params
from . import mla_cost
from .activations import keeps_scores
from .fp8_cost import fp8_savings, head_fp8_savings
from .hardware import Cluster, all_to_all_time, collective_time, gemm_time, memory_time, p2p_time, ring_bytes
from .moe_cost import expert_parallel_time, moe_fraction, moe_mlp_costs, router_time
from .muon_cost import muon_time
from .offload_cost import offload_seconds
from .pipeline_cost import pipeline_time
from .traffic import (
    context_parallel_bytes,
    element_bytes,
    embedding_collectives,
    head_collectives,
    layer_collectives,
    mtp_projection_collectives,
    ulysses_sent_bytes,
)


@dataclasses.dataclass
class StepTime:
    """Seconds of one iteration and its parts (per GPU; the pipeline part includes the bubble)."""
    pipeline: float      # forward + backward of every microbatch through the schedule (simulated makespan)
    dp_exposed: float    # DP gradient / parameter collectives not hidden behind backward
    optimizer: float
    finalize: float      # finalize_model_grads: SP-replicated grads over TP, tied embedding over first/last stage
    bubble: float        # the simulator's mean idle fraction of the pipeline part
    layer_forward: float  # one layer, one microbatch: compute + TP collectives
    schedule: str = ""   # the pipeline schedule simulated (schedules.SCHEDULES name, or zb_v)
    offload: float = 0.0  # --cpu-offloading's reloads over PCIe, every microbatch (offload_cost.py)

    @property
    def total(self) -> float:
        return self.pipeline + self.dp_exposed + self.optimizer + self.finalize + self.offload



class PassCosts(NamedTuple):
    """Seconds of one microbatch through a part of the model; weight is the part of backward that
    the zero-bubble schedules run as W (the weight-gradient GEMMs, the embedding table's gradient)."""
    forward: float
    backward: float
    recompute: float = 0.0
    weight: float = 0.0


def layer_costs(c, b, cluster: Cluster, layout) -> PassCosts:
    """Seconds of one transformer layer on one microbatch of b samples, per GPU of `layout` (ParallelLayout).
    TP collectives are not overlapped with compute (they are not here). Backward runs two GEMMs per
    forward GEMM of a weight (the input's gradient, the weight's): the weight's are W."""
    s, h, a, d = c.seq_length, c.hidden_size, c.num_attention_heads, mla_cost.core_head_dim(c)
    q, kv, f = a * d, c.num_query_groups * d, c.ffn_hidden_size
    tp, cp = layout.tp, layout.cp
    sp, elt, m = layout.sequence_split, element_bytes(c), s // cp * b  # this CP rank's s / C queries
    fc1 = f * (2 if c.swiglu else 1)
    mlp = gemm_time(cluster, m, fc1 // tp, h) + gemm_time(cluster, m, h, f // tp)
    mlp_stream = elt * (3 if c.swiglu else 2) * m * f / tp
    moe = moe_fraction(c)
    eligible = mlp  # the GEMMs of the linears FP8 runs (fp8_cost.py): the MLP's, the experts', the attention's
    if moe:  # MoE layers' experts instead of the dense MLP, weighed by the fraction of MoE layers
        moe_gemms, moe_stream = moe_mlp_costs(c, m, cluster, tp)
        eligible = (1 - moe) * mlp + moe * (moe_gemms - router_time(c, m, cluster))  # not the router
        mlp, mlp_stream = (1 - moe) * mlp + moe * moe_gemms, (1 - moe) * mlp_stream + moe * moe_stream
    if c.multi_latent_attention:  # its projections stay in the model's precision
        gemms = mla_cost.projection_time(c, m, cluster, tp) + mlp
    else:
        projections = gemm_time(cluster, m, (q + 2 * kv) // tp, h) + gemm_time(cluster, m, h, q // tp)
        gemms, eligible = projections + mlp, eligible + projections
    if c.cp_comm_type == "a2a" and cp > 1:  # Ulysses: the whole sequence on a / (tp C) heads per rank
        core = gemm_time(cluster, s, s, d, b * a // (tp * cp)) + gemm_time(cluster, s, d, s, b * a // (tp * cp))
    else:  # this rank's s / C queries against all s keys
        core = gemm_time(cluster, s // cp, s, d, b * a // tp) + gemm_time(cluster, s // cp, d, s, b * a // tp)
    rep, att = m * h / (tp if sp else 1), a * s // cp * s * b / tp
    # streamed bytes: 2 norms (read + write), 2 bias-dropout-adds (2 reads, 1 write, 1-byte mask),
    # the activation (read + write, SwiGLU reads two), Q/K/V layout copies; unfused attention adds
    # softmax (read + write) and dropout (read + write + mask) of the s x s scores
    layout_copies = mla_cost.streamed_elements(c, m, tp) if c.multi_latent_attention else 2 * 3 * m * q / tp
    stream = elt * (4 * rep + 6 * rep + layout_copies) + 2 * rep + mlp_stream
    unfused = keeps_scores(c) and cp == 1  # the CP attention runs flash-style blocks
    att_stream = (4 * elt + 1) * att if unfused else 0.0
    stream += att_stream
    comm_fwd, comm_bwd = (tp_time(cluster, ops, tp) for ops in layer_collectives(c, b, tp))
    fwd_core = core + memory_time(cluster, stream)
    cp_fwd, cp_bwd = context_parallel_time(c, b, cluster, layout, core)
    ep_fwd, ep_bwd = (moe * x for x in expert_parallel_time(c, b, cluster, layout))
    fp8_fwd, fp8_bwd = fp8_savings(c, m, cluster, tp, eligible, moe)
    fwd = gemms + fwd_core + comm_fwd + cp_fwd + ep_fwd - fp8_fwd
    bwd = 2 * (gemms + fwd_core) + comm_bwd + cp_bwd + ep_bwd - fp8_bwd
    if not unfused:
        bwd += core / 2  # flash-style kernels recompute the scores in backward
    if c.recompute_granularity == "full":
        rec = fwd
    elif c.recompute_granularity == "selective":  # the attention core only: scores, softmax, dropout
        rec = core + memory_time(cluster, att_stream)
    else:
        rec = 0.0
    return PassCosts(fwd, bwd, rec, gemms - fp8_fwd)


def context_parallel_time(c, b, cluster: Cluster, layout, core):
    """(forward s, backward s) of one layer's CP attention traffic not hidden by compute. p2p: the ring
    sends K/V to the neighbour (layout.stride("cp") ranks apart; over the network when a CP group spans
    nodes) while
    the current block computes, so only what exceeds the attention core (forward: core, backward:
    2 core) shows. all_gather: a collective before the attention, not overlapped. a2a: four
    all-to-alls (q, k, v, the output; their gradients backward) around the attention, not overlapped."""
    C, tp, apart = layout.cp, layout.tp, layout.stride("cp")
    if C == 1:
        return 0.0, 0.0
    if c.cp_comm_type == "a2a":
        took = sum(all_to_all_time(cluster, sent, C, apart) for sent in ulysses_sent_bytes(c, b, tp))
        return took, took
    fwd_bytes, bwd_bytes = context_parallel_bytes(c, b, tp)
    if c.cp_comm_type == "all_gather":
        full = fwd_bytes * C / (C - 1)
        return (collective_time(cluster, "all_gather", full, C, apart),
                collective_time(cluster, "reduce_scatter", full, C, apart))
    crosses = layout.crosses_node("cp", cluster.gpus_per_node)
    step = fwd_bytes / (C - 1)
    fwd = (C - 1) * p2p_time(cluster, step, crosses)
    bwd = (2 * C - 1) * p2p_time(cluster, step, crosses)
    return max(fwd - core, 0.0), max(bwd - 2 * core, 0.0)


def head_costs(c, b, cluster: Cluster, layout) -> PassCosts:
    """The output layer and the vocab-parallel cross entropy (last stage); W: the output weight's GEMM
    (--fp8-output-layer: in FP8, fp8_cost.head_fp8_savings)."""
    tp, m, h, v = layout.tp, c.seq_length // layout.cp * b, c.hidden_size, c.padded_vocab_size
    g = gemm_time(cluster, m, v // tp, h)
    ce = memory_time(cluster, 3 * 4 * m * v / tp)  # fp32 logits: max, exp-sum, grad passes
    comm_fwd, comm_bwd = (tp_time(cluster, ops, tp) for ops in head_collectives(c, b, tp))
    fp8_fwd, fp8_bwd = head_fp8_savings(c, m, cluster, tp, g)
    return PassCosts(g + ce + comm_fwd - fp8_fwd, 2 * g + ce + comm_bwd - fp8_bwd, weight=g - fp8_fwd)


def mtp_costs(c, b, cluster: Cluster, layout, layer, head, embedding) -> PassCosts:
    """The last stage's multi-token prediction modules, each: one layer (not under the decoder's full
    recompute), the [embedding; hidden] projection 2h -> h / t and its collectives, the next tokens'
    embedding and the shared head; layer / head / embedding: PassCosts of one microbatch."""
    depth, tp = c.mtp_num_layers or 0, layout.tp
    m, h = c.seq_length // layout.cp * b, c.hidden_size
    g = gemm_time(cluster, m, h // tp, 2 * h)
    comm_fwd, comm_bwd = (tp_time(cluster, ops, tp) for ops in mtp_projection_collectives(c, b, tp))
    mod = layer._replace(recompute=0.0) if c.recompute_granularity == "full" else layer
    parts = [mod, head, embedding, PassCosts(g + comm_fwd, 2 * g + comm_bwd, weight=g)]
    return PassCosts(*(depth * sum(p[i] for p in parts) for i in range(4)))


def embedding_costs(c, b, cluster: Cluster, layout) -> PassCosts:
    """The vocab-parallel embedding (first stage): its backward is the table's gradient (W) and,
    with SP, the gather of the output's gradient (B)."""
    tp = layout.tp
    touch = memory_time(cluster, 3 * c.seq_length // layout.cp * b * c.hidden_size * element_bytes(c))
    comm_fwd, comm_bwd = (tp_time(cluster, ops, tp) for ops in embedding_collectives(c, b, tp))
    return PassCosts(touch + comm_fwd, 2 * touch + comm_bwd, weight=2 * touch)


def tp_time(cluster: Cluster, ops, tp):
    """Seconds of a list of (kind, bytes) collectives over a TP group (consecutive ranks, the layout's
    order puts TP fastest: ParallelLayout.stride("tp") is 1)."""
    return sum(collective_time(cluster, kind, nbytes, tp, 1) for kind, nbytes in ops)


def dp_collectives(mem, strategy, shards=1, micro=1, full_recompute=False) -> dict:
    """{comm.py tag: (collective, full buffer bytes, calls per iteration)} of one iteration's
    data-parallel traffic over `shards` ranks (DP x CP) under the sharding `strategy`. no_shard: the
    gradient buffers (estimate()'s 'grads') all-reduced once. optim / optim_grads (ZeRO-1/2):
    reduce-scattered once, then the parameter buffers all-gathered once. optim_grads_params (ZeRO-3):
    the gradients reduce-scattered once, the parameters all-gathered before every microbatch's forward
    and backward (and its recomputed forward under full recompute), docs/zero.md. Sharded buffers are
    estimate()'s shard bytes x shards; the parameters gathered are its param_gather bytes (--fp8-param-gather:
    one byte an element of the FP8 weights)."""
    if not shards_optimizer(strategy):
        return {"dp-grads": ("all_reduce", mem["grads"], 1)}
    grads = mem["grads"] * (shards if shards_grads(strategy) else 1)
    gathered = mem.get("param_gather", mem["params"])
    if not shards_params(strategy):
        return {"dp-grads": ("reduce_scatter", grads, 1), "dp-params": ("all_gather", gathered, 1)}
    gathers = (3 if full_recompute else 2) * micro
    return {"dp-grads": ("reduce_scatter", grads, 1), "dp-params": ("all_gather", gathered * shards, gathers)}


def dp_groups(mem, dp) -> list:
    """[(ranks, bytes)] of the buffers' DP groups: the dense ones over dp ranks (DP x CP), a MoE's
    expert buffers (estimate()'s expert_dp) over expert-DP e = DP x CP / EP; bytes a dict with the
    group's 'params', 'grads', 'param_gather' and 'fp8_copies' per rank, as estimate() counts them."""
    keys = ("params", "grads", "param_gather", "fp8_copies")
    if "expert_dp" not in mem:
        return [(dp, mem)]
    e, *expert = mem["expert_dp"]
    return [(dp, {k: mem.get(k, 0) - x for k, x in zip(keys, expert)}), (e, dict(zip(keys, expert)))]


def dp_traffic(mem, dp, strategy, micro=1, full_recompute=False) -> dict:
    """{tag: bytes one rank sends in an iteration} of dp_collectives() over each of dp_groups() (the
    dense buffers over dp ranks, the experts over expert-DP), to compare with debug.count_traffic()."""
    out = {}
    for n, part in dp_groups(mem, dp):
        for tag, (kind, nbytes, calls) in dp_collectives(part, strategy, n, micro, full_recompute).items():
            out[tag] = out.get(tag, 0.0) + calls * ring_bytes(kind, nbytes, n)
    return out


def _dp_exposed(cluster, t, mem, layout, micro, fwd, bwd_rec, full_recompute):
    """Seconds of one stage's DP collectives not hidden by compute. Gradients: the last microbatch's
    backward hides all buckets but the last (taken as an eighth) with --overlap-grad-reduce. ZeRO-1/2
    parameters: the next forward hides them with --overlap-param-gather. ZeRO-3 parameters: each
    unit's gather is prefetched behind the previous unit's compute, so per pass the first of
    layers + 1 units (the root) shows, or what exceeds the pass's compute."""
    ddp = t.ddp_config()
    shown, tags = 0.0, {}
    # the dense buffers over dp_cp, a MoE's experts over edp (dp_groups' order); the experts' time adds
    for name, (n, part) in zip(("dp_cp", "edp"), dp_groups(mem, layout.dp_cp)):
        for tag, (kind, nbytes, calls) in dp_collectives(part, ddp.data_parallel_sharding_strategy, n, micro,
                                                          full_recompute).items():
            took = collective_time(cluster, kind, nbytes, n, layout.stride(name))
            tags[tag] = (tags.get(tag, (0.0,))[0] + took, calls)
    for tag, (took, calls) in tags.items():
        if tag == "dp-grads":
            window, overlap, parts = mem["layers"] * bwd_rec, ddp.overlap_grad_reduce, 8
        else:
            window, overlap, parts = mem["layers"] * fwd, ddp.overlap_param_gather, 8
        if calls == 1:
            shown += max(took - window, took / parts) if overlap else took
            continue
        units = mem["layers"] + 1
        back = calls // micro - 1  # gathers in the backward phase of a microbatch (2 under full recompute)
        per_micro = [(took, mem["layers"] * fwd), (back * took, mem["layers"] * bwd_rec)]
        shown += micro * sum((max(g - w, g / units) if overlap else g) for g, w in per_micro)
    return shown


def step_time(c, t, cluster: Cluster, layout, mems, sp_grad_bytes=0) -> StepTime:
    """Seconds of one iteration on `layout` (ParallelLayout). mems: memory.estimate() of each pipeline
    stage (its grad and parameter buffer bytes are what the DP collectives move); the slowest stage counts.
    sp_grad_bytes: traffic.sequence_parallel_grad_bytes of the stage holding the most."""
    tp, pp, dp, b = layout.tp, layout.pp, layout.dp, t.micro_batch_size
    fwd, bwd, rec, _ = layer = layer_costs(c, b, cluster, layout)
    head, embedding = head_costs(c, b, cluster, layout), embedding_costs(c, b, cluster, layout)
    if c.mtp_num_layers:  # on the last stage, after the head
        mtp = mtp_costs(c, b, cluster, layout, layer, head, embedding)
        head = PassCosts(*(x + y for x, y in zip(head, mtp)))
    makespan, bubble, schedule = pipeline_time(c, t, cluster, layout, layer, head, embedding)
    elt = element_bytes(c)
    micro = t.global_batch_size // (t.micro_batch_size * dp)
    exposed = optimizer = 0.0
    for mem in mems:
        exposed = max(exposed, _dp_exposed(cluster, t, mem, layout, micro, fwd, bwd + rec,
                                           c.recompute_granularity == "full"))
        ddp = t.ddp_config()  # ZeRO-3: the params held are the shard already
        owned = sum((part["params"] - part.get("fp8_copies", 0)) / elt
                    / (n if ddp.shards_optimizer and not ddp.shards_params else 1)
                    for n, part in dp_groups(mem, layout.dp_cp))
        # Adam on fp32 main params: main, m, v read and written, the fp32 grad read, the param written;
        # Muon's matrices (muon_cost.py) instead: Newton-Schulz, its collectives and three elementwise passes
        muon = mem.get("muon")
        took = muon_time(cluster, t.muon_config(), muon) if muon else 0.0
        optimizer = max(optimizer, took + memory_time(cluster, (owned - (muon["elements"] if muon else 0))
                                                       * (3 * 2 * 4 + 4 + elt)))
    emb = collective_time(cluster, "all_reduce", sp_grad_bytes, tp, 1)
    if pp > 1 and not c.untie_embeddings_and_output_weights:  # tied word embeddings: first <-> last stage
        emb += collective_time(cluster, "all_reduce", c.padded_vocab_size * c.hidden_size / tp * 4,
                               layout.group_size("embd"), layout.stride("embd"))
    offload = micro * max(offload_seconds(cluster, mem.get("offloaded", 0)) for mem in mems)
    return StepTime(makespan, exposed, optimizer, emb, bubble, fwd, schedule, offload)
