"""Test-only reference: the rank grid as megatron/core/parallel_state.py built it before ParallelLayout
(commit 3f64f10), kept verbatim in its arithmetic so that tests/unit/test_parallel_layout.py can check
the one generator against it for every layout up to 16 ranks. Not imported by the library.

reference(world, tp, cp, pp, ep, etp, pp_grad) -> {"lists": {group: rank lists built}, "ranks": [per
rank {group: its members or None, position field: value}]}, the groups and fields ProcessGroups held.
"""


def grid_rank(tp_rank, dp_rank, pp_rank, tp, dp, cp_rank=0, cp=1):
    return tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))


def grid_rank_lists(tp, cp, dp, pp):
    def at(t, c, d, p):
        return grid_rank(t, d, p, tp, dp, c, cp)

    T, C, D, P = range(tp), range(cp), range(dp), range(pp)
    lists = {"tp": [[at(t, c, d, p) for t in T] for p in P for d in D for c in C],
             "dp": [[at(t, c, d, p) for d in D] for p in P for c in C for t in T],
             "pp": [[at(t, c, d, p) for p in P] for d in D for c in C for t in T],
             "mp": [[at(t, c, d, p) for p in P for t in T] for d in D for c in C]}
    lists["embd"] = [sorted({r[0], r[-1]}) for r in lists["pp"]]
    if cp > 1:
        lists["cp"] = [[at(t, c, d, p) for c in C] for p in P for d in D for t in T]
        lists["dp_cp"] = [[at(t, c, d, p) for d in D for c in C] for p in P for t in T]
    return lists


def expert_rank_lists(tp, dp, pp, ep):
    cells = [(t, p) for p in range(pp) for t in range(tp)]
    return ([[grid_rank(t, d, p, tp, dp) for d in range(b, b + ep)] for t, p in cells for b in range(0, dp, ep)],
            [[grid_rank(t, d, p, tp, dp) for d in range(j, dp, ep)] for t, p in cells for j in range(ep)])


def expert_grid_rank_lists(tp, cp, dp, pp, etp, ep):
    block, edp = tp * cp * dp, tp * cp * dp // (etp * ep)
    stages = [p * block for p in range(pp)]
    return {
        "etp": [[s + i + e * etp for i in range(etp)] for s in stages for e in range(edp * ep)],
        "ep": [[s + x + etp * (k + ep * d) for k in range(ep)]
               for s in stages for d in range(edp) for x in range(etp)],
        "edp": [[s + x + etp * (k + ep * d) for d in range(edp)]
                for s in stages for k in range(ep) for x in range(etp)],
        "tp_cp": [[s + d * tp * cp + i for i in range(tp * cp)] for s in stages for d in range(dp)]}


def _mine(lists, rank):
    found = [r for r in lists if rank in r]  # none: a middle pipeline stage's embd
    assert len(found) <= 1, (rank, lists)
    return found[0] if found else None


def reference(world, tp=1, cp=1, pp=1, ep=1, etp=None, pp_grad=False):
    """What initialize_model_parallel built on each rank (see the module docstring)."""
    dp = world // (tp * cp * pp)
    built = dict(grid_rank_lists(tp, cp, dp, pp))
    folded = etp not in (None, tp)
    if folded:
        built.update(expert_grid_rank_lists(tp, cp, dp, pp, etp, ep))
    elif ep > 1:
        built["ep"], built["edp"] = expert_rank_lists(tp, dp * cp, pp, ep)
    if pp_grad and pp > 1:
        built["pp_grad"] = built["pp"]
    ranks = []
    for rank in range(world):
        tp_rank, rest = rank % tp, rank // tp
        cp_rank, rest = rest % cp, rest // cp
        dp_rank, pp_rank = rest % dp, rest // dp
        g = {name: _mine(lists, rank) for name, lists in built.items()}
        g.setdefault("cp", None)
        g.setdefault("dp_cp", g["dp"])
        g.setdefault("pp_grad", None)
        g.setdefault("tp_cp", None)
        if folded:
            i = tp_rank + tp * (cp_rank + cp * dp_rank)
            pos = dict(etp_size=etp, etp_rank=i % etp, ep_size=ep, ep_rank=(i // etp) % ep,
                       edp_size=tp * dp * cp // (etp * ep), edp_rank=i // (etp * ep))
        else:
            j = cp_rank + cp * dp_rank
            pos = dict(etp_size=tp, etp_rank=tp_rank, ep_size=ep, ep_rank=j % ep, edp_size=dp * cp // ep,
                       edp_rank=j // ep)
            g["etp"] = g["tp"]
            g.setdefault("ep", None)
            g.setdefault("edp", g["dp_cp"])
        pos.update(tp_size=tp, cp_size=cp, dp_size=dp, pp_size=pp, tp_rank=tp_rank, cp_rank=cp_rank,
                   dp_rank=dp_rank, pp_rank=pp_rank, expert_folded=folded,
                   pp_ranks=[grid_rank(tp_rank, dp_rank, p, tp, dp, cp_rank, cp) for p in range(pp)])
        ranks.append({**g, **pos})
    return {"lists": built, "ranks": ranks}
