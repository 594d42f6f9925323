"""Every tensor-parallel collective of a training step, as data: (kind, full buffer bytes).

Itemised from the code that runs them (tensor_parallel/mappings.py, layers.py, cross_entropy.py,
models/common/language_module.py, distributed/finalize.py); cost.py turns them into time and
tests/distributed/test_planner_traffic.py checks them against the bytes a gloo run sends.
Kinds: all_reduce, all_gather, reduce_scatter; bytes: the full (gathered / unreduced) buffer.
Activations have the parameters' dtype; the cross entropy's statistics are fp32.
"""
from ...core.parallel_layout import sequence_split
from ...core.pipeline_parallel.schedules import build_schedule
from ...core.pipeline_parallel.zb_v import zb_v
from ...core.tensor_parallel.param_meta import param_meta
from . import mla_cost
from .hardware import ring_bytes


def element_bytes(c):
    """Bytes of one activation element: the parameters' dtype (2 for bf16 / fp16, else 4)."""
    return 2 if c.params_dtype is not None and c.params_dtype.itemsize == 2 else 4


def _act(c, b):
    """Bytes of one CP rank's [s / C, b, h] activations."""
    return c.seq_length // c.context_parallel_size * b * c.hidden_size * element_bytes(c)


def _kv_heads(c):
    """Key / value heads of the attention core: every head's under multi-latent attention (the shared
    rotary key is expanded to them), else --num-query-groups."""
    return c.num_attention_heads if c.multi_latent_attention else (c.num_query_groups or c.num_attention_heads)


def ulysses_sent_bytes(c, b, tp) -> list:
    """Bytes one rank sends in each all-to-all of --cp-comm-type a2a (context_parallel.a2a_attention)
    per layer and microbatch of b samples, forward: q, k, v (heads scattered over the CP group, the
    sequence gathered) and the output back; backward: their gradients, the same bytes. Each tensor
    is this rank's [s/C, b, n/tp, d] and (C-1)/C of it leaves; K/V groups that do not split C ways
    go as one copy per query head. d: the core's head size (mla_cost.core_head_dim)."""
    C = c.context_parallel_size
    heads, groups = c.num_attention_heads // tp, _kv_heads(c) // tp
    kv_heads = groups if groups % C == 0 else heads
    one_head = (c.seq_length // C) * b * mla_cost.core_head_dim(c) * element_bytes(c) * (C - 1) / C
    return [heads * one_head, kv_heads * one_head, kv_heads * one_head, heads * one_head]


def context_parallel_bytes(c, b, tp) -> tuple[float, float]:
    """(forward, backward) bytes one rank sends over its CP group per layer and microbatch of b
    samples, with u = its K and V = 2 (s/C) b (g/tp) d x element bytes. p2p ring: forward (C-1) u,
    backward (C-1) u of K/V and C u of dK/dV (the last hop brings them home); all_gather: forward
    (C-1) u (all-gather), backward (C-1) u (reduce-scatter); a2a: ulysses_sent_bytes both ways."""
    C = c.context_parallel_size
    if C == 1:
        return 0.0, 0.0
    if c.cp_comm_type == "a2a":
        sent = sum(ulysses_sent_bytes(c, b, tp))
        return sent, sent
    u = 2 * (c.seq_length // C) * b * _kv_heads(c) // tp * mla_cost.core_head_dim(c) * element_bytes(c)
    if c.cp_comm_type == "p2p":
        return (C - 1) * u, (C - 1) * u + C * u
    if c.cp_comm_type == "all_gather":
        return (C - 1) * u, (C - 1) * u
    raise ValueError(f"the planner knows no --cp-comm-type {c.cp_comm_type}")


def layer_collectives(c, b, tp):
    """(forward, backward) lists of one transformer layer on a microbatch of b samples. Without SP:
    the row-parallel outputs are all-reduced forward, the column-parallel inputs' grads backward.
    With SP: all-gather before each column-parallel GEMM and reduce-scatter after each row-parallel
    one; backward gathers the input again (it keeps only its shard), reduce-scatters its grad, and
    all-gathers the row-parallel output's grad. Multi-latent attention's part: mla_cost.collectives."""
    if tp == 1:
        return [], []
    x = _act(c, b)
    if c.sequence_parallel:
        mlp = [("all_gather", x), ("reduce_scatter", x)], [("all_gather", x), ("all_gather", x), ("reduce_scatter", x)]
    else:
        mlp = [("all_reduce", x)], [("all_reduce", x)]
    attention = mla_cost.collectives(c, x, tp) if c.multi_latent_attention else mlp
    return attention[0] + mlp[0], attention[1] + mlp[1]


def embedding_collectives(c, b, tp):
    """(forward, backward) of the first stage's vocab-parallel embedding (+ learned positions)."""
    if tp == 1:
        return [], []
    x = _act(c, b)
    if not c.sequence_parallel:
        return [("all_reduce", x)], []
    backward = [("all_gather", x)]
    if c.position_embedding_type == "learned_absolute":  # [s, 1, h] positions scattered over s: grad gathered
        backward.append(("all_gather", x // b))
    return [("reduce_scatter", x)], backward


def head_collectives(c, b, tp):
    """(forward, backward) of the last stage: the output layer's input and the vocab-parallel cross
    entropy (max, then target logit and sum of exponentials, fp32 per token)."""
    if tp == 1:
        return [], []
    x, tokens = _act(c, b), c.seq_length // c.context_parallel_size * b
    ce = [("all_reduce", 4 * tokens), ("all_reduce", 2 * 4 * tokens)]
    if not c.sequence_parallel:
        return ce, [("all_reduce", x)]
    if c.untie_embeddings_and_output_weights:  # a column-parallel layer with SP input
        return [("all_gather", x)] + ce, [("all_gather", x), ("reduce_scatter", x)]
    return [("all_gather", x)] + ce, [("reduce_scatter", x)]


def mtp_collectives(c, b, tp):
    """(forward, backward) of one multi-token prediction module besides its transformer layer (a layer of
    layer_collectives): the next tokens' embedding, the [embedding; hidden] projection (column-parallel
    over 2h, its output gathered over TP and, with SP, scattered over the sequence again) and the head."""
    parts = (embedding_collectives(c, b, tp), mtp_projection_collectives(c, b, tp), head_collectives(c, b, tp))
    return [op for f, _ in parts for op in f], [op for _, bw in parts for op in bw]


def mtp_projection_collectives(c, b, tp):
    """(forward, backward) of a multi-token prediction module's [embedding; hidden] projection."""
    if tp == 1:
        return [], []
    x = _act(c, b)
    if c.sequence_parallel:
        return ([("all_gather", 2 * x), ("all_gather", x)],
                [("all_gather", 2 * x), ("reduce_scatter", 2 * x), ("all_gather", x)])
    return [("all_gather", x)], [("all_reduce", 2 * x)]


def stage_collectives(c, b, tp, layers, first, last):
    """(forward, backward) lists of one microbatch through a pipeline stage holding `layers` layers (the
    last stage's multi-token prediction layers among them); full recompute runs the decoder layers' forward
    collectives again in backward (not multi-token prediction's: the decoder block recomputes)."""
    f, bw = layer_collectives(c, b, tp)
    depth = (c.mtp_num_layers or 0) if last else 0
    fwd, bwd = f * layers, bw * layers + (f * (layers - depth) if c.recompute_granularity == "full" else [])
    mtp = mtp_collectives(c, b, tp)
    for on, (ef, eb) in ((first, embedding_collectives(c, b, tp)), (last, head_collectives(c, b, tp)),
                         (last, (mtp[0] * depth, mtp[1] * depth))):
        if on:
            fwd, bwd = fwd + ef, bwd + eb
    return fwd, bwd


def sequence_parallel_grad_bytes(params, tp):
    """Bytes of the fp32 gradients of the parameters SP replicates over TP (norms, row-parallel
    biases): finalize_model_grads all-reduces them over TP once per iteration."""
    if tp == 1:
        return 0
    return sum(4 * p.numel() for p in params if param_meta(p).sequence_parallel)


def iteration_tp_traffic(c, t, tp, dp, params, layers, first=True, last=True) -> dict:
    """{kind: bytes one rank of a stage sends over its TP group in one iteration}: every microbatch's
    stage_collectives plus the SP grads' all-reduce; `params` the stage's (memory.stage_params)."""
    M = t.global_batch_size // (t.micro_batch_size * dp)
    fwd, bwd = stage_collectives(c, t.micro_batch_size, tp, layers, first, last)
    out = {}
    for kind, nbytes in (fwd + bwd) * M + [("all_reduce", sequence_parallel_grad_bytes(params, tp))]:
        if nbytes:
            out[kind] = out.get(kind, 0.0) + ring_bytes(kind, nbytes, tp)
    return out


def p2p_message_bytes(c, b, tp):
    """Bytes of one message between pipeline stages: [s (/TP with SP), b, h] activations or grads."""
    return _act(c, b) // (tp if sequence_split(c.sequence_parallel, tp) else 1)


def layout_actions(layout, M) -> dict:
    """{pipeline rank: [Action]} of the schedule training runs on `layout` (ParallelLayout) for M micro-batches:
    ZB-V's V of two chunks (zb_v.py), else its schedule over layout.chunks chunks (the executor's choice)."""
    if layout.v_shape:
        return {r: zb_v(layout.pp, M, layout.chunks, r) for r in range(layout.pp)}
    return build_schedule(layout.pp, M, layout.chunks, layout.schedule)


def iteration_p2p_sent(c, t, layout, pp_rank) -> int:
    """Bytes pipeline rank pp_rank sends to its neighbours in one iteration: one message per send of
    the schedule training runs on `layout` (layout_actions, the executor's and the simulator's input)."""
    if layout.pp == 1:
        return 0
    M = t.global_batch_size // (t.micro_batch_size * layout.dp)
    sends = sum(op.kind.startswith("send") for a in layout_actions(layout, M)[pp_rank] for op in a.ops)
    return sends * p2p_message_bytes(c, t.micro_batch_size, layout.tp)
