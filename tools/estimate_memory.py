"""Predict the memory each rank holds, without running: parameters, gradients, optimizer
state (exact, from the same model code built on the meta device and the same bucket
layout as training) and activations (Korthikanti et al. 2022).

    python tools/estimate_memory.py --world-size 8 --tensor-model-parallel-size 2 \
        --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
        --micro-batch-size 4 --bf16 --use-distributed-optimizer --vocab-size 50257

Takes pretrain_gpt.py's flags plus --world-size; the flags training needs that change no byte (data,
--lr, --train-iters) default to the planner's (--mock-data unless data flags are given).
"""
import argparse
import dataclasses
import os
import sys
import types

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.comm import PlanGroup
from megatron.core.distributed import zero3
from megatron.core.distributed.ddp import DEFAULT_BUCKET_SIZE
from megatron.core.distributed.param_and_grad_buffer import bucket_layout
from megatron.core.distributed.sharded_buffer import unit_layout
from megatron.core.distributed.strategy import shards_grads, shards_params
from megatron.core.errors import MegatronUserError
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_state import validate_parallel_sizes
from megatron.core.tensor_parallel.param_meta import is_expert_parallel
from megatron.core.transformer import context_parallel
from megatron.core.transformer.moe.activation_memory import moe_extra_bytes_per_layer
from megatron.training.arguments import parse_args
from megatron.training.planner.predict import PLAN_DEFAULTS
from megatron.training.resolve import resolve, validate


def activation_bytes_per_layer(c, micro_batch, tp, sp):
    """Korthikanti et al. eq. 1-3 for 16-bit activations: s b h (34 + 5 a s / h) without TP,
    s b h (10 + 24/t + 5 a s/(h t)) with TP, s b h/t (34 + 5 a s/h) with TP and SP.
    fp32 activations (no --bf16/--fp16) double it. With --context-parallel-size C: the same on s / C
    tokens, with the CP attention's log-sum-exp instead of the s x s terms (context_parallel.py).
    MoE layers replace the MLP's share by theirs (moe/activation_memory.py), averaged over the layers."""
    s, b, h, a = c.seq_length, micro_batch, c.hidden_size, c.num_attention_heads
    if c.context_parallel_size > 1:
        return context_parallel.activation_bytes_per_layer(s, b, h, a, tp, sp, c.context_parallel_size,
                                                           2 if c.params_dtype != torch.float32 else 4) \
            + moe_extra_bytes_per_layer(c, s * b / c.context_parallel_size, tp, sp, c.params_dtype.itemsize)
    if tp == 1:
        per = s * b * h * (34 + 5 * a * s / h)
    elif sp:
        per = s * b * h * (34 + 5 * a * s / h) / tp
    else:
        per = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    return per * (1 if c.params_dtype != torch.float32 else 2) + moe_extra_bytes_per_layer(
        c, s * b, tp, sp, c.params_dtype.itemsize)


_built = {}  # (config, stage) -> its meta parameters: a planner asks for the same stage many times


def stage_params(model_cfg, pp_rank):
    """(trainable parameters (meta tensors) of pipeline stage pp_rank, its layers)."""
    params, _, layers = _stage(model_cfg, pp_rank)
    return params, layers


def stage_chunks(model_cfg, pp_rank):
    """The model chunks (meta tensors) of pipeline stage pp_rank, in build order."""
    return _stage(model_cfg, pp_rank)[1]


def _stage(model_cfg, pp_rank):
    """(trainable parameters, chunks, layers) of pipeline stage pp_rank, built once per config."""
    key = (repr(model_cfg), pp_rank)
    if key not in _built:
        tp, pp = model_cfg.tensor_model_parallel_size, model_cfg.pipeline_model_parallel_size
        groups = types.SimpleNamespace(tp=PlanGroup(tp, 0), pp_size=pp, pp_rank=pp_rank,
                                       is_first_stage=pp_rank == 0, is_last_stage=pp_rank == pp - 1)
        V = model_cfg.virtual_pipeline_model_parallel_size or 1
        # the same chunks, in the same order, as training.build_model
        shard_cfg = dataclasses.replace(model_cfg, context_parallel_size=1)  # CP ranks hold the same parameters
        chunks = [GPTModel(shard_cfg, groups, pre_process=groups.is_first_stage and v == 0,
                           post_process=groups.is_last_stage and v == V - 1, device="meta", vp_stage=v)
                  for v in range(V)]
        _built[key] = ([p for c in chunks for p in c.parameters() if p.requires_grad], chunks,
                       sum(len(c.decoder.layers) for c in chunks))
    return _built[key]


def estimate(model_cfg, t, world_size, pp_rank=0):
    """{'params', 'grads', 'optimizer', 'activations', 'working', 'layers', 'in_flight', 'gathered'} for
    a rank of pipeline stage pp_rank (DP rank 0, TP rank 0: other TP ranks hold the same). params,
    grads and optimizer: bytes held across the step (with --data-parallel-sharding-strategy
    optim_grads the gradient shard, optim_grads_params the parameter shard too); expert_dp (MoE with
    its own expert buffers only): (expert-DP size, the experts' part of params, of grads); gathered: ZeRO-3's
    largest working set of full parameters (a chunk's root unit and one layer, two with
    --overlap-param-gather), 0 otherwise; working: the recomputed chunk's activations."""
    tp, pp = model_cfg.tensor_model_parallel_size, model_cfg.pipeline_model_parallel_size
    dp = validate_parallel_sizes(world_size, tp, pp, model_cfg.virtual_pipeline_model_parallel_size,
                                 model_cfg.context_parallel_size)
    t.validate(dp)
    params, layers = stage_params(model_cfg, pp_rank)
    by_dtype = {}
    ep, etp = model_cfg.expert_model_parallel_size, model_cfg.expert_tensor_parallel_size
    folded = model_cfg.num_experts is not None and etp not in (None, tp)  # expert-DP = TP x DP x CP / (ETP x EP)
    for p in params:  # MoE experts (this EP rank's) in buffers of their own, sharded over expert-DP
        by_dtype.setdefault((p.dtype, (ep > 1 or folded) and is_expert_parallel(p)), []).append(p)
    dp_cp = dp * model_cfg.context_parallel_size  # DDP and the distributed optimizer work over DP x CP
    bucket_size = t.ddp_bucket_size or max(DEFAULT_BUCKET_SIZE, 1_000_000 * dp_cp)
    out = {"params": 0, "grads": 0, "optimizer": 0, "gathered": 0}
    strategy = t.data_parallel_sharding_strategy
    chunk_units = zero3.units(nn.ModuleList(stage_chunks(model_cfg, pp_rank))) if shards_params(strategy) else None
    unit_bytes = {}  # ZeRO-3: (chunk, unit) -> padded bytes over its buffers (a MoE layer: dense + experts)
    for (dtype, expert), ps in by_dtype.items():
        shards = (tp * dp_cp // (etp * ep) if folded else dp_cp // ep) if expert else dp_cp
        held = out["params"], out["grads"]
        if chunk_units is not None:  # one bucket per unit, as DistributedDataParallel
            per_unit = zero3.layout_units(chunk_units, ps)
            numels = [p.numel() for u in per_unit for p in u]
            offsets, buckets, total = unit_layout([[p.numel() for p in u] for u in per_unit], shards)
        else:
            numels = [p.numel() for p in reversed(ps)]
            offsets, buckets, total = bucket_layout(numels, bucket_size, shards, t.use_distributed_optimizer)
        elt = torch.empty((), dtype=dtype).element_size()
        grad_elt = 2 if (t.grad_reduce_in_bf16 and dtype == torch.bfloat16) else 4
        out["grads"] += total * grad_elt // (shards if shards_grads(strategy) else 1)
        if t.use_distributed_optimizer:
            out["params"] += total * elt // (shards if chunk_units is not None else 1)
            # padding in a shard holds no parameter: no main copy, no Adam state for it
            owned = _owned_real(offsets, numels, buckets, shards)
        else:
            out["params"] += sum(numels) * elt
            owned = sum(numels)
        out["optimizer"] += owned * (8 + (4 if dtype != torch.float32 else 0))
        if expert:  # (expert-DP size, params, grads): the planner moves these bytes over expert-DP
            _, p_bytes, g_bytes = out.get("expert_dp", (shards, 0, 0))
            out["expert_dp"] = (shards, p_bytes + out["params"] - held[0], g_bytes + out["grads"] - held[1])
        if chunk_units is not None and shards > 1:  # over one rank the shard is the whole, never gathered
            for key, n in _unit_sizes(chunk_units, ps, buckets).items():
                unit_bytes[key] = unit_bytes.get(key, 0) + n * elt
    if chunk_units is not None:
        out["gathered"] = zero3.working_set([[unit_bytes.get((c, u), 0) for u in range(len(chunk))]
                                             for c, chunk in enumerate(chunk_units)], t.overlap_param_gather)
    out["layers"] = layers
    out["activations"], out["working"] = kept_activation_bytes(model_cfg, t.micro_batch_size, tp, out["layers"])
    num_micro = t.global_batch_size // (t.micro_batch_size * dp)
    out["in_flight"] = min(pp - pp_rank, num_micro) if pp > 1 else 1  # 1F1B warm-up depth
    return out


def kept_activation_bytes(c, micro_batch, tp, layers):
    """(bytes kept per microbatch in flight, bytes of the one recomputed chunk being worked on) for
    `layers` layers, after --recompute-granularity: full keeps each chunk's 16-bit input (2 s b h, /t
    with SP) and rebuilds one chunk of layers at a time; selective drops the 5 a s / h t score term."""
    full = activation_bytes_per_layer(c, micro_batch, tp, c.sequence_parallel)
    if c.recompute_granularity is None or layers == 0:
        return int(full * layers), 0
    s, b, h = c.seq_length, micro_batch, c.hidden_size
    rep = s * b * h / (tp if c.sequence_parallel else 1) * (2 if c.params_dtype != torch.float32 else 4)
    if c.recompute_granularity == "selective":
        scores = s * b * h * 5 * c.num_attention_heads * s / (h * tp)
        if c.context_parallel_size > 1:  # the CP attention keeps no s x s scores to drop
            scores = 0
        return int((full - scores * (1 if c.params_dtype != torch.float32 else 2)) * layers), 0
    k = min(c.recompute_num_layers or 1, layers)
    if c.recompute_method == "block":  # the first k layers of the stage recomputed, the rest kept
        return int(rep * k + full * (layers - k)), int(full)
    return int(rep * -(-layers // k)), int(full * k)


def total_bytes(est):
    """Peak bytes of a rank from estimate(): states + kept activations of every microbatch in
    flight + the recomputed chunk's activations during its backward + ZeRO-3's gathered parameters."""
    return (est["params"] + est["grads"] + est["optimizer"] + est["activations"] * est["in_flight"]
            + est["working"] + est["gathered"])


def _unit_sizes(chunk_units, ps, buckets):
    """{(chunk, unit): padded elements of its bucket} of one buffer of `ps` laid out by
    zero3.layout_units (the last unit first, units without any of `ps` left out)."""
    mine = {id(p) for p in ps}
    keys = [(c, u) for c in reversed(range(len(chunk_units))) for u in reversed(range(len(chunk_units[c])))
            if any(id(p) in mine for p in chunk_units[c][u][1])]
    return {key: b.end - b.start for key, b in zip(keys, buckets)}


def _owned_real(starts, numels, buckets, dp, rank=0):
    """Parameter elements (padding excluded) in DP rank `rank`'s shard of every bucket; starts:
    each parameter's buffer offset (the layout's)."""
    offsets = [(s, s + n) for s, n in zip(starts, numels)]
    owned = 0
    for b in buckets:
        k = (b.end - b.start) // dp
        lo, hi = b.start + rank * k, b.start + (rank + 1) * k
        owned += sum(max(0, min(e, hi) - max(s, lo)) for s, e in (offsets[i] for i in b.params))
    return owned


def _defaults(data, length):
    """PLAN_DEFAULTS without --mock-data when data flags are given, or --train-iters with a length."""
    out, it = [], iter(PLAN_DEFAULTS)
    for flag in it:
        value = [] if flag == "--mock-data" else [next(it)]
        if not ((data and flag == "--mock-data") or (length and flag == "--train-iters")):
            out += [flag] + value
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--world-size", type=int, default=1)
    known, rest = pre.parse_known_args(argv)
    given = {a.split("=")[0] for a in rest}
    data, length = given & {"--data-path", "--train-data-path"}, given & {"--train-iters", "--train-samples"}
    rest = _defaults(data, length) + rest  # the user's own flags come after and win
    try:
        if known.world_size < 1:
            raise MegatronUserError(f"--world-size must be at least 1, got {known.world_size}")
        model_cfg, t = parse_args(rest)
        resolve(model_cfg, t, known.world_size)
        validate(model_cfg, t, known.world_size)
        stages = [estimate(model_cfg, t, known.world_size, r) for r in range(model_cfg.pipeline_model_parallel_size)]
    except MegatronUserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r, est in enumerate(stages):
        total = total_bytes(est)
        print(f"stage {r} ({est['layers']} layers), per rank (world {known.world_size}): "
              f"bytes: params {est['params']:,}"
              f" grads {est['grads']:,} optimizer {est['optimizer']:,}"
              + (f" (+ gathered parameters up to {est['gathered']:,})" if est["gathered"] else "")
              + f" | activations {est['activations']:,} per"
              f" microbatch x {est['in_flight']} in flight | total {total / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
