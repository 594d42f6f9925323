"""Muon on paper: which whole matrices a rank orthogonalises, what its optimizer step moves, and how long it
takes (Newton-Schulz GEMMs, the TP mode's collectives, the distributed optimizer's owner exchange,
core/optimizer/muon_owners.py). memory.estimate() fills its "muon" entry with muon_stage(); cost.step_time
adds muon_time().

Newton-Schulz of an m x n matrix (m >= n), per step: X X^T (n x n x m), A A (n^3) and B X (n x m x n),
2 steps (2 m n^2 + n^3) FLOPs in all. duplicated: every TP rank runs the whole matrix after an all-gather
of its fp32 momentum; distributed: the two products over the split dim run on 1/TP of it, the Gram matrix
(non-split side squared, in the matmul dtype) all-reduced every step; blockwise: the shard alone.
"""
from ...core.optimizer.muon_matrix import ns_cost, split_dim
from ...core.optimizer.muon_owners import balance, exchange_elements, segments
from ...core.tensor_parallel.param_meta import is_muon_matrix, param_meta
from .hardware import all_to_all_time, collective_time, gemm_time, memory_time, ring_bytes


def _whole_matrices(p, groups, cfg):
    """[(rows, cols, split dim or None, TP size)] of the whole matrices of parameter p."""
    dim, _, tp = split_dim(p, groups, "duplicated")
    shape = list(p.shape)
    if dim is not None:
        shape[dim] *= tp
    qkv = param_meta(p).qkv_split if cfg.split_qkv else None
    if not qkv:
        return [(shape[0], shape[1], dim, tp)]
    return [(rows * shape[0] // sum(qkv), shape[1], dim, tp) for rows in qkv]


def muon_stage(ordered, offsets, buckets, shards, sharded, groups, cfg):
    """Muon's part of one DDP buffer (its parameters in layout order, offsets, buckets, over `shards` DP
    ranks): {"ns": [whole matrices DP rank 0 orthogonalises], "gather" / "scatter": bytes it sends to the
    owners (its momentum) and from them (their updates), "elements": Muon elements it holds state for}."""
    idx = [i for i, p in enumerate(ordered) if is_muon_matrix(p)]
    bucket_of = {i: b for b in buckets for i in b.params}
    segs = [segments(offsets[i], ordered[i].numel(), bucket_of[i].start, bucket_of[i].end, shards if sharded else 1)
            for i in idx]
    costs = [ns_cost(ordered[i], groups, cfg) for i in idx]
    if sharded:
        owners = balance(costs, [[hi - lo for lo, hi in s] for s in segs], shards)
        mine = [i for i, o in zip(idx, owners) if o == 0]
        gather, scatter = exchange_elements(segs, shards, costs)
    else:
        mine, gather, scatter = idx, 0, 0
    return {"ns": [m for i in mine for m in _whole_matrices(ordered[i], groups, cfg)],
            "gather": 4 * gather, "scatter": 4 * scatter, "elements": sum(s[0][1] - s[0][0] for s in segs)}


def _ns_time(cluster, m, n, dim, tp, cfg, ns_bytes):
    """Seconds of Newton-Schulz (and its TP collectives) on one whole m x n matrix, per TP rank."""
    steps = cfg.num_ns_steps
    if dim is not None and cfg.tp_mode == "blockwise":
        m, n = (m // tp, n) if dim == 0 else (m, n // tp)
        dim = None
    if dim is None or cfg.tp_mode == "duplicated":
        big, small = max(m, n), min(m, n)
        gemms = gemm_time(cluster, small, small, big) * 2 + gemm_time(cluster, small, small, small)
        gathered = collective_time(cluster, "all_gather", 4 * m * n, tp, 1) if dim is not None else 0.0
        return steps * gemms + gathered
    gram, split = (n, m // tp) if dim == 0 else (m, n // tp)  # the split side is X's columns
    gemms = gemm_time(cluster, gram, gram, split) * 2 + gemm_time(cluster, gram, gram, gram)
    return steps * (gemms + collective_time(cluster, "all_reduce", gram * gram * ns_bytes, tp, 1))


def _ns_bytes(cfg, on_gpu):
    return 2 if on_gpu and cfg.fp32_matmul_prec != "high" else 4


def muon_time(cluster, cfg, muon, on_gpu=True):
    """Seconds of Muon's part of the optimizer step of a rank (memory.estimate()'s "muon"): Newton-Schulz of
    the matrices it orthogonalises, the owner exchange (over each buffer's DP group) and the elementwise
    passes (momentum, decay, update: about 24 bytes an element)."""
    total = sum(_ns_time(cluster, m, n, dim, tp, cfg, _ns_bytes(cfg, on_gpu)) for m, n, dim, tp in muon["ns"])
    total += sum(all_to_all_time(cluster, gather, ranks, 1) + all_to_all_time(cluster, scatter, ranks, 1)
                 for ranks, gather, scatter in muon["exchange"])
    return total + memory_time(cluster, muon["elements"] * 24)


def muon_traffic(cfg, muon, on_gpu=True) -> dict:
    """{comm.py tag: bytes a rank sends in one Muon step}: "muon-tp" (duplicated: the fp32 all-gather of each
    split matrix; distributed: its norm and every step's Gram matrix all-reduced), "muon-gather" and
    "muon-scatter" (the distributed optimizer's owner exchange): what debug.count_traffic() counts."""
    tp_bytes = 0.0
    for m, n, dim, tp in muon["ns"]:
        if dim is None or cfg.tp_mode == "blockwise":
            continue
        if cfg.tp_mode == "duplicated":
            tp_bytes += ring_bytes("all_gather", 4 * m * n, tp)
        else:
            gram = n if dim == 0 else m
            tp_bytes += ring_bytes("all_reduce", 4, tp) + cfg.num_ns_steps * ring_bytes(
                "all_reduce", gram * gram * _ns_bytes(cfg, on_gpu), tp)
    out = {"muon-tp": tp_bytes} if tp_bytes else {}
    for tag, i in (("muon-gather", 1), ("muon-scatter", 2)):
        total = sum(e[i] for e in muon["exchange"] if e[0] > 1)
        if total:
            out[tag] = total
    return out
