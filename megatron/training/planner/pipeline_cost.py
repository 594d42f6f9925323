"""The pipeline part of a step on paper: the schedule training runs (--pipeline-schedule, the
ParallelLayout's schedule; ZB-V's action lists from zb_v) run by the simulator
(megatron/core/pipeline_parallel/simulator.py) with every action costed for its rank and model
chunk: F the chunk's forward, B its backward's input gradient (and a full recompute's forward), W its
weight gradients (cost.PassCosts.weight); in a schedule without W actions B does both. A comm action
costs its sends. The makespan holds the bubble of that very schedule: ZB-H1 / ZB-H2 / ZB-V fill
theirs with W, which a closed-form 1F1B bubble cannot show.
"""
from ...core.pipeline_parallel.simulator import loop_stage, simulate, v_stage
from ...core.pipeline_parallel.split import chunk_roles, stage_layers
from .hardware import Cluster, p2p_time
from .traffic import layout_actions, p2p_message_bytes

_SIM_ACTIONS = 60_000  # simulate at most this many actions; beyond, extrapolate the steady state


def schedule_of(layout):
    """(name, build(M) -> {rank: [Action]}, stage_of, streams) of the schedule training runs on `layout`."""
    stage_of, streams = (v_stage, True) if layout.v_shape else (loop_stage, False)  # V: own channels
    return layout.schedule, lambda m: layout_actions(layout, m), stage_of, streams


def chunk_costs(c, layout, layer, head, embedding, split):
    """{(rank, chunk): {"F": s, "B": s, "W": s}} from cost.PassCosts of one layer, the head and the
    embedding, by the layers and roles each chunk holds (split.stage_layers / chunk_roles); split:
    the schedule has W actions (else B is the whole backward and W costs nothing)."""
    out = {}
    for rank in range(layout.pp):
        for chunk in range(layout.chunks):
            n = stage_layers(c, layout, rank, chunk)[1]
            parts = [(n, layer)] + [(1, p) for p, on in zip((embedding, head), chunk_roles(layout, rank, chunk)) if on]
            f = sum(k * p.forward for k, p in parts)
            backward = sum(k * (p.backward + p.recompute) for k, p in parts)
            w = sum(k * p.weight for k, p in parts) if split else 0.0
            out[rank, chunk] = {"F": f, "B": backward - w, "W": w}
    return out


def pipeline_time(c, t, cluster: Cluster, layout, layer, head, embedding):
    """(makespan s, bubble fraction, schedule name) of one iteration's microbatches through the
    schedule of `layout` (ParallelLayout); layer / head / embedding: cost.PassCosts of one microbatch."""
    tp, pp = layout.tp, layout.pp
    M = t.global_batch_size // (t.micro_batch_size * layout.dp)
    name, build, stage_of, streams = schedule_of(layout)
    split = any(a.kind == "W" for a in build(min(M, 2 * pp))[0])
    table = chunk_costs(c, layout, layer, head, embedding, split)
    message = p2p_message_bytes(c, t.micro_batch_size, tp)
    # a hop between neighbouring stages leaves the node or not as the layout places them (the rank order's)
    hop = {(r, q): p2p_time(cluster, message, layout.stages_cross_node(r, q, cluster.gpus_per_node))
           for r in range(pp) for q in ((r + 1) % pp, (r - 1) % pp)} if pp > 1 else {}

    def cost(rank, action):
        if action.kind in table[rank, action.chunk]:
            return table[rank, action.chunk][action.kind]
        sends = sum(hop[rank, op.peer] for op in action.ops if op.kind.startswith("send"))
        return max(sends, sum(hop[op.peer, rank] for op in action.ops if op.kind.startswith("recv")))

    return (*simulate_long(build, pp, M, cost, stage_of, streams), name)


def simulate_long(build, P, M, cost, stage_of=loop_stage, streams=False):
    """(makespan, bubble) of build(M)'s actions; long ones are simulated at two smaller microbatch
    counts and extended linearly (the steady state repeats one period per microbatch)."""
    def run(m):
        return simulate(build(m), cost, stage_of, streams)
    if P == 1:
        busy = sum(cost(0, a) for a in build(M)[0] if a.kind in ("F", "B", "W"))
        return busy, 0.0
    per_micro = max(len(acts) for acts in build(P).values()) / P
    if P * M * per_micro <= _SIM_ACTIONS:
        tl = run(M)
        return tl.makespan, tl.bubble
    M1 = max(2 * P, int(_SIM_ACTIONS // (2 * P * per_micro)) // P * P)  # past the warm-up (ZB-V: 2P)
    t1, t2 = run(M1), run(M1 + P)
    extra = (M - M1 - P) / P
    makespan = t2.makespan + (t2.makespan - t1.makespan) * extra
    idle1, idle2 = t1.makespan * t1.bubble, t2.makespan * t2.bubble
    return makespan, (idle2 + (idle2 - idle1) * extra) / makespan
