"""The memory each rank holds, predicted without running: parameters, gradients and optimizer state
exact (the model built on the meta device from the rank's stand-in groups, and DDP's own buffer
grouping and bucket layout, core/distributed/buffers.py) and activations (activations.py).
tools/estimate_memory.py is its command line; the planner (predict.py) calls it as is."""
import collections

import torch
from torch import nn

from ...core.distributed import zero3
from ...core.distributed.buffers import buffer_groups, buffer_layout
from ...core.fp8.weights import fp8_weight_pairs
from ...core.models.gpt import GPTModel
from ...core.tensor_parallel.param_meta import is_muon_matrix
from ..config.resolve import parallel_layout
from .activations import kept_activation_bytes, loss_bytes
from .muon_cost import muon_stage
from .offload_cost import offloaded_bytes

# (config, layout, stage) -> its meta chunks, least recently used first. Module state because it is only a
# cache (a miss rebuilds the same chunks), bounded because a search over thousands of layouts would otherwise
# keep every model it built: a prediction asks for each stage of one layout a few times in a row, so the
# limit only needs to hold one layout's stages (pipeline sizes above it rebuild, slower but the same)
_BUILT_LIMIT = 32
_built = collections.OrderedDict()


def stage_chunks(model_cfg, t, world_size, pp_rank):
    """The model chunks (meta tensors) of pipeline stage pp_rank's first rank (TP, CP, DP, EP rank 0), in
    training.build_model's order, built once per config from its stand-in groups (ParallelLayout.plan_groups)."""
    layout = parallel_layout(model_cfg, t, world_size)
    key = (repr(model_cfg), repr(layout), pp_rank)
    if key in _built:
        _built.move_to_end(key)
        return _built[key]
    groups = layout.plan_groups(layout.group_of("pp", 0)[pp_rank])
    V = layout.chunks
    _built[key] = [GPTModel(model_cfg, groups, pre_process=groups.is_first_stage and v == 0,
                            post_process=groups.is_last_stage and v == V - 1, device="meta", vp_stage=v)
                   for v in range(V)]
    while len(_built) > _BUILT_LIMIT:
        _built.popitem(last=False)
    return _built[key]


def stage_params(model_cfg, t, world_size, pp_rank):
    """(trainable parameters (meta tensors) of pipeline stage pp_rank, its layers: the last stage's multi-token
    prediction layers count as layers for the activations)."""
    chunks = stage_chunks(model_cfg, t, world_size, pp_rank)
    layers = sum(len(c.decoder.layers) + (len(c.mtp.layers) if c.mtp is not None else 0) for c in chunks)
    return [p for c in chunks for p in c.parameters() if p.requires_grad], layers


def estimate(model_cfg, t, world_size, pp_rank=0):
    """{'params', 'grads', 'optimizer', 'activations', 'working', 'layers', 'in_flight', 'gathered'} for
    a rank of pipeline stage pp_rank (DP rank 0, TP rank 0: other TP ranks hold the same). params,
    grads and optimizer: bytes held across the step (with --data-parallel-sharding-strategy
    optim_grads the gradient shard, optim_grads_params the parameter shard too); muon (--optimizer muon:
    muon_cost.muon_stage's, "exchange" one (DP ranks, gather, scatter bytes) per buffer); expert_dp (MoE with
    its own expert buffers only): (expert-DP size, the experts' part of params, of grads); activations: the layers'
    and, on the last stage, the cross entropy's (activations.loss_bytes); gathered: ZeRO-3's
    largest working set of full parameters (a chunk's root unit and one layer, two with
    --overlap-param-gather), 0 otherwise; working: the recomputed chunk's activations; offloaded: the bytes per
    microbatch --cpu-offloading keeps on the host instead (left out of activations)."""
    layout = parallel_layout(model_cfg, t, world_size)
    t.validate(layout.dp)
    ddp = t.ddp_config(model_cfg.fp8_param_gather)
    params, layers = stage_params(model_cfg, t, world_size, pp_rank)
    groups = layout.plan_groups(layout.group_of("pp", 0)[pp_rank])  # the stand-ins the chunks were built with
    chunks = stage_chunks(model_cfg, t, world_size, pp_rank)
    fp8 = {id(p) for p, _ in fp8_weight_pairs(chunks)} if ddp.fp8_param_gather else set()
    chunk_units = zero3.units(nn.ModuleList(chunks)) if ddp.shards_params else None
    bucket_size = ddp.bucket_elements(layout.dp_cp)  # DDP and the distributed optimizer work over DP x CP
    # param_gather: the parameter buffers' bytes the DP gathers move, counted as params is (FP8 weights' buckets
    # one byte an element with --fp8-param-gather); fp8_copies: those buckets' FP8 copies held (in params)
    out = {"params": 0, "grads": 0, "optimizer": 0, "gathered": 0, "param_gather": 0, "fp8_copies": 0}
    unit_bytes = {}  # ZeRO-3: (chunk, unit) -> padded bytes over its buffers (a MoE layer: dense + experts)
    for (dtype, expert, in_fp8), ps in buffer_groups(params, layout.expert_dp_apart, fp8).items():
        shards = layout.edp if expert else layout.dp_cp  # MoE experts (this EP rank's) over expert-DP
        held = out["params"], out["grads"], out["param_gather"], out["fp8_copies"]
        ordered, offsets, buckets, total = buffer_layout(ps, bucket_size, shards, ddp, chunk_units)
        numels = [p.numel() for p in ordered]
        elt = torch.empty((), dtype=dtype).element_size()
        gathered_elt = 1 if in_fp8 else elt  # --fp8-param-gather: the FP8 weights are gathered as bytes
        grad_elt = 2 if (ddp.grad_reduce_in_bf16 and dtype == torch.bfloat16) else 4
        out["grads"] += total * grad_elt // (shards if ddp.shards_grads else 1)
        if ddp.shards_optimizer:
            per_rank = shards if chunk_units is not None else 1
            # the FP8 weights' copies (fp8_param_gather.py): ZeRO-3 their shard, ZeRO-1/2 whole, one byte each
            copies = total // per_rank if in_fp8 else 0
            out["params"] += total * elt // per_rank + copies
            out["fp8_copies"] += copies
            out["param_gather"] += total * gathered_elt // per_rank
            # padding in a shard holds no parameter: no main copy, no optimizer state for it
            owned = [_owned_real(offsets, numels, buckets, shards, which=w) for w in _by_state(ordered, t)]
        else:
            out["params"] += sum(numels) * elt
            owned = [sum(n for n, m in zip(numels, w) if m) for w in _by_state(ordered, t)]
        if t.optimizer == "muon":
            part = muon_stage(ordered, offsets, buckets, shards, ddp.shards_optimizer, groups, t.muon_config())
            muon = out.setdefault("muon", {"ns": [], "exchange": [], "elements": 0})
            muon["ns"] += part["ns"]
            muon["exchange"].append((shards, part["gather"], part["scatter"]))
            muon["elements"] += part["elements"]
        main = 4 if dtype != torch.float32 else 0  # the fp32 main copy (an fp32 model's is its own storage)
        out["optimizer"] += sum(n * (state + main) for n, state in zip(owned, STATE_BYTES[t.optimizer]))
        if expert:  # (expert-DP size, params, grads, param_gather, fp8_copies): the planner moves these over expert-DP
            before = out.get("expert_dp", (shards, 0, 0, 0, 0))
            out["expert_dp"] = (shards, *(b + out[k] - h for b, k, h in
                                          zip(before[1:], ("params", "grads", "param_gather", "fp8_copies"), held)))
        if chunk_units is not None and shards > 1:  # over one rank the shard is the whole, never gathered
            for key, n in _unit_sizes(chunk_units, ps, buckets).items():
                unit_bytes[key] = unit_bytes.get(key, 0) + n * gathered_elt
    if chunk_units is not None:
        out["gathered"] = zero3.working_set([[unit_bytes.get((c, u), 0) for u in range(len(chunk))]
                                             for c, chunk in enumerate(chunk_units)], ddp.overlap_param_gather)
    out["layers"] = layers
    mtp = sum(len(c.mtp.layers) for c in chunks if c.mtp is not None)  # outside the decoder's full recompute
    out["activations"], out["working"] = kept_activation_bytes(model_cfg, t.micro_batch_size, layout.tp, layers, mtp)
    # the cross entropy's kept tensor on the last stage, once per loss (the model's and each MTP module's)
    losses = sum(1 + (len(c.mtp.layers) if c.mtp is not None else 0) for c in chunks if c.post_process)
    out["activations"] += int(losses * loss_bytes(model_cfg, t.micro_batch_size, layout.tp))
    # --cpu-offloading: the first layers' kept activations live on the host (offload_cost.py)
    out["offloaded"] = offloaded_bytes(model_cfg, t, layout.tp, [len(c.decoder.layers) for c in chunks])
    out["activations"] -= out["offloaded"]
    num_micro = t.global_batch_size // (t.micro_batch_size * layout.dp)
    out["in_flight"] = min(layout.pp - pp_rank, num_micro) if layout.pp > 1 else 1  # 1F1B warm-up depth
    return out


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


def _owned_real(starts, numels, buckets, dp, rank=0, which=None):
    """Parameter elements (padding excluded) in DP rank `rank`'s shard of every bucket; starts:
    each parameter's buffer offset (the layout's); which: per parameter whether it counts (None: all)."""
    offsets = [(s, s + n) for s, n in zip(starts, numels)]
    owned = 0
    for b in buckets:
        k = (b.end - b.start) // dp
        lo, hi = b.start + rank * k, b.start + (rank + 1) * k
        owned += sum(max(0, min(offsets[i][1], hi) - max(offsets[i][0], lo)) for i in b.params
                     if which is None or which[i])
    return owned


# per optimizer, fp32 bytes of state per element of (Muon's matrices, the rest): Adam two moments, SGD's and
# Muon's momentum one (muon.py), AdamW on what Muon does not take
STATE_BYTES = {"adam": (8, 8), "sgd": (4, 4), "muon": (4, 8)}


def _by_state(params, t):
    """Per parameter (buffer order) whether it is one of Muon's matrices, and whether it is not."""
    muon = [t.optimizer == "muon" and is_muon_matrix(p) for p in params]
    return muon, [not m for m in muon]
