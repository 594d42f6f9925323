"""Which gradient buffers a model gets and how each is laid out in buckets: DistributedDataParallel
builds its buffers from these, and the memory estimator (training/planner/memory.py) counts them, so
the two cannot disagree."""
from ..tensor_parallel.param_meta import is_expert_parallel
from . import zero3
from .param_and_grad_buffer import bucket_layout
from .sharded_buffer import unit_layout


def buffer_groups(params, experts_apart: bool, fp8_weights=frozenset()) -> dict:
    """{(dtype, expert, fp8): parameters} of each buffer, in module order: one per dtype, and with
    experts_apart (ParallelLayout.expert_dp_apart) the experts' (param_meta.is_expert_parallel) in
    buffers of their own, reduced over expert-DP; the parameters whose ids are in fp8_weights (the FP8
    linears' weights under --fp8-param-gather) in buffers of their own too, gathered as FP8 bytes."""
    out = {}
    for p in params:
        if p.requires_grad:
            out.setdefault((p.dtype, experts_apart and is_expert_parallel(p), id(p) in fp8_weights), []).append(p)
    return out


def buffer_layout(params, bucket_size, shards, config, chunk_units=None):
    """(params in buffer order, their offsets, bucket layouts, total elements) of one buffer sharded over
    `shards` ranks. ZeRO-3 (chunk_units, zero3.units of the model): one bucket per unit, the last unit
    first; otherwise the parameters in reverse (roughly backward) order, buckets of at least
    bucket_size elements, padded to a multiple of `shards` when config (DistributedDataParallelConfig)
    shards the optimizer."""
    if chunk_units is not None:
        per_unit = zero3.layout_units(chunk_units, params)
        offsets, layouts, total = unit_layout([[p.numel() for p in ps] for ps in per_unit], shards)
        return [p for ps in per_unit for p in ps], offsets, layouts, total
    params = list(reversed(params))
    offsets, layouts, total = bucket_layout([p.numel() for p in params], bucket_size, shards, config.shards_optimizer)
    return params, offsets, layouts, total
