"""One Muon matrix: its orthogonalised, scaled update from this rank's TP shard of its momentum, the whole
matrix's in every layout but --muon-tp-mode blockwise.

A fused QKV weight ([q_1..q_k, k, v] rows per query group, ParamMeta.qkv_split) is three matrices, as
Megatron-Core orthogonalises it: Q (the q rows of every group, in group order), K and V. TP splits the
weight by whole query groups, so the Q rows of a shard are a run of the whole Q's rows: gathering the
shards' parts along dim 0 gives the whole Q in order.

TP modes (the matrix split over `group` along `dim`):
    duplicated   all-gather the shards along dim, orthogonalise the whole matrix on every rank, keep this
                 rank's chunk (the order of the gathered blocks is the one of a strided split's blocks, a
                 row permutation of the whole matrix: the same update, newton_schulz.py)
    distributed  run Newton-Schulz on the shard with the Gram matrix all-reduced at each step
    blockwise    each shard on its own with its own sizes' scale: depends on the TP size (Megatron-Core's)
"""
import torch

from .. import comm
from ..tensor_parallel.param_meta import param_meta, tensor_parallel_group
from .newton_schulz import newton_schulz, scale_factor


def split_dim(param, groups, tp_mode):
    """(the dim `param` is split along over TP, the group, its size); dim None when it is whole here or
    blockwise treats the shard as whole."""
    meta = param_meta(param)
    group = tensor_parallel_group(param, groups)
    tp = comm.world(group) if meta.tensor_parallel else 1
    return (meta.partition_dim if tp > 1 and tp_mode != "blockwise" else None), group, tp


def parts(u, qkv_split):
    """The matrices of u (one, or Q, K and V of a fused QKV shard)."""
    if qkv_split is None:
        return [u]
    per_group = sum(qkv_split)
    if u.shape[0] % per_group:
        raise ValueError(f"a QKV weight of {u.shape[0]} rows is not whole query groups of {per_group} rows")
    grouped = u.reshape(u.shape[0] // per_group, per_group, u.shape[1])
    return [t.reshape(-1, u.shape[1]) for t in torch.split(grouped, list(qkv_split), dim=1)]


def join(outs, shape, qkv_split):
    if qkv_split is None:
        return outs[0]
    groups = shape[0] // sum(qkv_split)
    return torch.cat([o.reshape(groups, -1, shape[1]) for o in outs], dim=1).reshape(shape)


def _one(x, dim, group, tp, cfg, schedule, dtype):
    rows, cols = x.shape
    if dim == 0:
        rows *= tp
    elif dim == 1:
        cols *= tp
    scale = scale_factor(rows, cols, cfg.scale_mode) * cfg.extra_scale_factor
    if dim is None:
        out = newton_schulz(x, schedule, dtype=dtype)
    elif cfg.tp_mode == "distributed":  # the split dim becomes the columns of X: summed in its Gram matrix
        out = newton_schulz(x, schedule, transpose=dim == 0, group=group, dtype=dtype)
    else:  # duplicated
        t = x if dim == 0 else x.mT
        whole = newton_schulz(comm.all_gather_dim0(t, group, tag="muon-tp"), schedule, dtype=dtype)
        out = whole.chunk(tp, dim=0)[comm.rank(group)]
        out = out if dim == 0 else out.mT
    return out * scale


def orthogonalize(u, param, groups, cfg, schedule, dtype):
    """The update of `param` (this rank's TP shard's shape) from u, its momentum (or Nesterov's mix) of
    that shape: the scaled orthogonalisation of each whole matrix it holds, this rank's part of it.
    Collective over param's TP group (duplicated and distributed modes, when it is split)."""
    dim, group, tp = split_dim(param, groups, cfg.tp_mode)
    qkv = param_meta(param).qkv_split if cfg.split_qkv else None
    outs = [_one(x, dim, group, tp, cfg, schedule, dtype) for x in parts(u, qkv)]
    return join(outs, u.shape, qkv)


def ns_cost(param, groups, cfg) -> float:
    """Newton-Schulz FLOPs of `param`'s whole matrices (about 2 steps (2 m n^2 + n^3), m >= n, each; the
    planner's formula): what the distributed optimizer balances over its ranks."""
    dim, _, tp = split_dim(param, groups, "duplicated")
    shape = list(param.shape)
    if dim is not None:
        shape[dim] *= tp
    qkv = param_meta(param).qkv_split if cfg.split_qkv else None
    mats = [(r * shape[0] // sum(qkv), shape[1]) for r in qkv] if qkv else [tuple(shape)]
    return sum(2 * cfg.num_ns_steps * (2 * max(m, n) * min(m, n) ** 2 + min(m, n) ** 3) for m, n in mats)
