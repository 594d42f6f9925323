"""ZB-V (Qi et al. 2024): two model chunks per rank in a V shape, as action lists.

Rank p holds virtual stage p (chunk 0) and stage 2P - 1 - p (chunk 1): activations go down
the ranks through chunk 0, turn on the last rank (chunk 0 to chunk 1 in place, no message)
and come back up through chunk 1; the loss is on rank 0's chunk 1. Messages are named by
simulator.v_stage. The order of F, B and W on each rank is found by list scheduling for a
given F:B:W ratio (default equal; messages free): a free rank runs a
B whose gradient is there, else an F whose input is there (chunk 1 first) while the rank holds
fewer than 2P chunk-microbatches (P stage-microbatches: 1F1B's peak activation memory), else
a pending W. Messages are placed as in zero_bubble.py.

Run by the executor (executor.py, v_shape) on a model built in the V layout (split.v_layer_split,
split.chunk_roles; --pipeline-schedule zb-v). Not in schedules.SCHEDULES: its chunks are not the
loop layout the other schedules share (simulate it with stage_of=simulator.v_stage, streams=True).
"""
from functools import lru_cache

from .actions import Action, Op, _check


def _is_ready(P, r, kind, c, mb, done, t):
    """Whether this action's input is there at step t."""
    if kind == "F":
        dep = (r - 1, "F", 0) if c == 0 and r > 0 else (r + 1, "F", 1) if c == 1 and r < P - 1 else \
            (r, "F", 0) if c == 1 else None
    else:
        dep = (r, "F", 1) if c == 1 and r == 0 else (r - 1, "B", 1) if c == 1 else \
            (r, "B", 1) if r == P - 1 else (r + 1, "B", 0)
    if dep is None:
        return True
    at = done.get((dep[0], dep[1], dep[2], mb))
    return at is not None and at <= t


@lru_cache(maxsize=64)
def v_order(P, M, costs=(1.0, 1.0, 1.0)) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Per rank, (kind, chunk, microbatch) in order: list scheduling with one chunk's F, B, W
    costing `costs` (messages free)."""
    cost = dict(zip("FBW", costs))
    nf, nb = [[0, 0] for _ in range(P)], [[0, 0] for _ in range(P)]
    pending_w = [[] for _ in range(P)]
    held, free_at, done, order, t = [0] * P, [0.0] * P, {}, [[] for _ in range(P)], 0.0
    while any(len(o) < 6 * M for o in order):
        for r in range(P):
            if free_at[r] > t:
                continue
            pick = None
            for c in (1, 0):  # B: the chunk nearer the loss first
                mb = nb[r][c]
                if mb < nf[r][c] and _is_ready(P, r, "B", c, mb, done, t):
                    pick = ("B", c, mb)
                    break
            if pick is None:
                for c in (1, 0):
                    mb = nf[r][c]
                    if mb < M and held[r] < 2 * P and _is_ready(P, r, "F", c, mb, done, t):
                        pick = ("F", c, mb)
                        break
            if pick is None and pending_w[r]:
                pick = ("W",) + pending_w[r].pop(0)
            if pick is None:
                continue
            kind, c, mb = pick
            order[r].append(pick)
            free_at[r] = done[(r, kind, c, mb)] = t + cost[kind]  # results are there from then on
            if kind == "F":
                nf[r][c] += 1
                held[r] += 1
            elif kind == "B":
                nb[r][c] += 1
                pending_w[r].append((c, mb))
            else:
                held[r] -= 1
        later = [x for x in list(free_at) + list(done.values()) if x > t]
        _check(bool(later) or all(len(o) == 6 * M for o in order), "zb-v list scheduling made no progress")
        t = min(later, default=t)
    return tuple(tuple(o) for o in order)


def _ops(P, r, kind, c, mb):
    """(receive before, send after) of one F or B on rank r in the V layout (None: none)."""
    down, up = r + 1, r - 1  # chunk 0 activations go down the ranks, chunk 1's come back up
    if kind == "F":
        src = (up if r > 0 else None) if c == 0 else (down if r < P - 1 else None)
        dst = (down if r < P - 1 else None) if c == 0 else (up if r > 0 else None)
        return (Op("recv_fwd", c, mb, src) if src is not None else None,
                Op("send_fwd", c, mb, dst) if dst is not None else None)
    src = (down if r < P - 1 else None) if c == 0 else (up if r > 0 else None)
    dst = (up if r > 0 else None) if c == 0 else (down if r < P - 1 else None)
    return (Op("recv_bwd", c, mb, src) if src is not None else None,
            Op("send_bwd", c, mb, dst) if dst is not None else None)


def zb_v(P, M, V, rank, forward_only=False, costs=(1.0, 1.0, 1.0)) -> list[Action]:
    """ZB-V: V = 2 chunks per rank in a V shape (simulate with stage_of=simulator.v_stage).
    costs: the F:B:W ratio the order is found for (the paper's default: equal)."""
    _check(V == 2 and P >= 2, "zb-v runs two model chunks per rank on at least 2 pipeline ranks")
    steps = v_order(P, M, tuple(float(c) for c in costs))[rank]
    if forward_only:
        steps = [s for s in steps if s[0] == "F"]
    actions, sends = [], ()
    for kind, c, mb in steps:
        if kind == "W":
            if sends:
                actions.append(Action("comm", ops=sends, async_sends=True))
                sends = ()
            actions.append(Action("W", c, mb))
            continue
        recv, send = _ops(P, rank, kind, c, mb)
        ops = tuple(o for o in (*sends, recv) if o is not None)
        if ops:
            actions.append(Action("comm", ops=ops, async_sends=True))
        actions.append(Action(kind, c, mb))
        sends = (send,) if send is not None else ()
    if sends:
        actions.append(Action("comm", ops=sends, async_sends=True))
    return actions
