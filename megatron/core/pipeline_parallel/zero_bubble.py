"""Zero-bubble schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism") as action lists.

The backward is split in two: B (gradient of the stage input, which the previous stage
waits for) and W (weight gradients, which nobody waits for), so a rank can fill the time
it would idle waiting for a gradient with W's of earlier microbatches:

    Action("W", chunk, mb)   weight gradients of microbatch mb (backward_split.py)

ZB-H1: 1F1B's order of F and B (P - rank - 1 warm-up forwards), with rank r's W of
microbatch j right after its B of microbatch j + r (the last r W's at the end). Each rank
holds at most P microbatches' activations, 1F1B's peak (on rank 0). Bubble per iteration
(P - 1)(F + B - W) for B >= W (simulated exactly: tests/unit/test_zero_bubble.py).
ZB-H2: 2 (P - rank - 1) warm-up forwards and W delayed by 2 rank: up to 2P - 1 microbatches
held; bubble (P - 1)(F + B - 2W), or 0, between consecutive iterations' parallelograms
(Timeline.steady_bubble); within one iteration the last stage's start-up (P - 1) F stays
(the paper removes it by overlapping iterations through the optimizer's post-validation).

Messages: sends are posted right after the F or B that produced them and not waited for
(Action.async_sends: the executor waits for them at the end of the step); a receive is
posted and waited for just before the F or B that needs it, merged with the previous
sends where nothing comes between. Forward-only runs are the forwards alone, in order.
"""
from .actions import Action, _Builder, _check


def compute_order(P, M, rank, warmup, delay) -> list[tuple[str, int]]:
    """(kind, microbatch) in order: `warmup` forwards, then one F and one B in turn, then the
    last B's; W of microbatch j right after the B of j + delay, the rest at the end."""
    warmup = min(warmup, M)
    fb = [("F", mb) for mb in range(warmup)]
    for i in range(M - warmup):
        fb += [("F", warmup + i), ("B", i)]
    fb += [("B", mb) for mb in range(M - warmup, M)]
    out, done_b, done_w = [], 0, 0
    for kind, mb in fb:
        out.append((kind, mb))
        if kind == "B":
            done_b += 1
            while done_w < done_b - delay:
                out.append(("W", done_w))
                done_w += 1
    return out + [("W", mb) for mb in range(done_w, M)]


def _actions(P, M, rank, order, forward_only=False) -> list[Action]:
    b = _Builder(P, 1, rank, forward_only)
    sends = ()
    for kind, mb in order:
        if kind == "W":
            if sends:
                b.actions.append(Action("comm", ops=sends, async_sends=True))
                sends = ()
            b.actions.append(Action("W", 0, mb))
            continue
        recv = b.recv_fwd(0) if kind == "F" else b.recv_bwd(0)
        ops = tuple(o for o in (*sends, recv) if o is not None)
        if ops:
            b.actions.append(Action("comm", ops=ops, async_sends=True))
        b.actions.append(Action(kind, 0, mb))
        sends = tuple(o for o in (b.send_fwd(0, mb) if kind == "F" else b.send_bwd(0, mb),) if o is not None)
    if sends:
        b.actions.append(Action("comm", ops=sends, async_sends=True))
    return b.actions


def zb_h1(P, M, V, rank, forward_only=False) -> list[Action]:
    """ZB-H1: 1F1B's memory, bubble (P - 1)(F + B - W)."""
    _check(V == 1, "zb-h1 runs one model chunk per rank")
    if forward_only:
        return _actions(P, M, rank, [("F", mb) for mb in range(M)], True)
    return _actions(P, M, rank, compute_order(P, M, rank, P - rank - 1, rank))


def zb_h2(P, M, V, rank, forward_only=False) -> list[Action]:
    """ZB-H2: about twice 1F1B's memory on the first ranks, bubble (P - 1)(F + B - 2W) or 0."""
    _check(V == 1, "zb-h2 runs one model chunk per rank")
    if forward_only:
        return _actions(P, M, rank, [("F", mb) for mb in range(M)], True)
    return _actions(P, M, rank, compute_order(P, M, rank, 2 * (P - rank - 1), 2 * rank))
