"""Pipeline schedules as data: a pure function (P, M, V, rank) -> [Action] per schedule.

P pipeline ranks, M microbatches, V model chunks per rank. Rank p's chunk v is virtual
stage s = v * P + p; activations flow s -> s + 1 and their gradients s + 1 -> s, so the
last rank's chunk v feeds rank 0's chunk v + 1. An action list is run in order by one
executor (executor.run_actions) and by the simulator (simulator.simulate):

    Action("F", chunk, mb)            forward of microbatch mb through model chunk `chunk`
    Action("B", chunk, mb)            its backward (only the input gradient where the list has W's)
    Action("W", chunk, mb)            its weight gradients (zero-bubble schedules, zero_bubble.py)
    Action("comm", ops=(Op, ...))     messages posted together (one batch_isend_irecv), then waited for

Op.kind is send_fwd / recv_fwd (activations) or send_bwd / recv_bwd (their gradients);
Op.chunk and Op.mb name this rank's chunk and microbatch the tensor belongs to; Op.peer
is the other pipeline rank. Within one comm action ops are in a fixed order (send_fwd,
recv_fwd, send_bwd, recv_bwd) so that with P = 2, where both neighbours are the same
rank, the two ends list their messages in the same order.

The 1F1B and interleaved lists follow Megatron-LM's schedules op for op (their batched
p2p calls become comm actions); the simulator proves for P <= 8, M <= 16, V <= 3 that
every send meets its receive in order and nothing deadlocks (tests/unit/test_schedules.py).
"""

from ..errors import ScheduleError  # noqa: F401 (callers catch it from here)
from .actions import Action, Op, _Builder, _check
from .zero_bubble import zb_h1, zb_h2


def no_pipelining(P, M, V, rank, forward_only=False) -> list[Action]:
    """One stage: forward and backward each microbatch in turn (gradient accumulation)."""
    _check(P == 1 and V == 1, "no_pipelining needs P = 1 and V = 1")
    return [a for mb in range(M) for a in ([Action("F", 0, mb)] if forward_only
                                           else [Action("F", 0, mb), Action("B", 0, mb)])]


def one_f_one_b(P, M, V, rank, forward_only=False) -> list[Action]:
    """1F1B (PipeDream-flush): P - rank - 1 warm-up forwards, then alternate one forward
    and one backward, then the remaining backwards. At most P - rank microbatches wait
    for their backward on rank `rank`."""
    _check(V == 1, "1F1B runs one model chunk per rank (use interleaved_1f1b for V > 1)")
    b = _Builder(P, 1, rank, forward_only)
    warmup = M if forward_only else min(P - rank - 1, M)
    steady = M - warmup
    for mb in range(warmup):
        b.comm(b.recv_fwd(0))
        b.F(0, mb)
        b.comm(b.send_fwd(0, mb))
    if steady > 0:
        b.comm(b.recv_fwd(0))
    for i in range(steady):
        fwd, bwd = warmup + i, i
        b.F(0, fwd)
        b.comm(b.send_fwd(0, fwd), b.recv_bwd(0))
        b.B(0, bwd)
        b.comm(b.send_bwd(0, bwd), b.recv_fwd(0) if i < steady - 1 else None)
    for bwd in range(steady, 0 if forward_only else M):
        b.comm(b.recv_bwd(0))
        b.B(0, bwd)
        b.comm(b.send_bwd(0, bwd))
    return b.actions


def interleaved_1f1b(P, M, V, rank, forward_only=False) -> list[Action]:
    """Interleaved 1F1B (Narayanan et al. 2021): V chunks per rank, microbatches in groups
    of P per chunk. The bubble shrinks by V; needs M a multiple of P."""
    _check(P >= 2 and V >= 2, "interleaved_1f1b needs P >= 2 and V >= 2")
    _check(M % P == 0, f"interleaved_1f1b needs M ({M}) to be a multiple of P ({P})")
    b = _Builder(P, V, rank, forward_only)
    total = M * V

    def chunk(k, forward):
        c = (k % (P * V)) // P
        return c if forward else V - 1 - c

    def mb(k):
        return (k // (P * V)) * P + k % P

    all_warmup = forward_only or M == P
    warmup = total if all_warmup else min((P - rank - 1) * 2 + (V - 1) * P, total)
    steady = total - warmup
    first, last = rank == 0, rank == P - 1

    b.comm(b.recv_fwd(0))
    for k in range(warmup):
        v = chunk(k, True)
        b.F(v, mb(k))
        nv = chunk(k + 1, True)
        recv_prev = not (first and nv == 0) and k != total - 1
        grad = b.recv_bwd(V - 1) if (k == warmup - 1 and not all_warmup and not last) else None
        b.comm(b.send_fwd(v, mb(k)), b.recv_fwd(nv) if recv_prev else None, grad)
    for i in range(steady):
        fk, bk = warmup + i, i
        fv, bv = chunk(fk, True), chunk(bk, False)
        b.F(fv, mb(fk))
        b.B(bv, mb(bk))
        if first:  # rank 0 receives what the last rank sent P - 1 steps ago, for the next chunk
            nfv = chunk(fk - (P - 1), True)
            recv_prev, nfv = nfv != V - 1, nfv + 1
        else:
            recv_prev, nfv = True, chunk(fk + 1, True)
        if last:
            nbv = chunk(bk - (P - 1), False)
            recv_next, nbv = nbv != 0, nbv - 1
        else:
            recv_next, nbv = True, chunk(bk + 1, False)
        recv_prev = recv_prev and i != steady - 1
        b.comm(b.send_fwd(fv, mb(fk)), b.recv_fwd(nfv) if recv_prev else None,
               b.send_bwd(bv, mb(bk)), b.recv_bwd(nbv) if recv_next else None)
    if not forward_only:
        if all_warmup:
            b.comm(b.recv_bwd(V - 1))
        for k in range(steady, total):
            v = chunk(k, False)
            b.B(v, mb(k))
            nv = chunk(k + 1, False)
            recv_next = not (last and nv == V - 1) and k != total - 1
            b.comm(b.send_bwd(v, mb(k)), b.recv_bwd(nv) if recv_next else None)
    return b.actions


def _forward_pass(P, M, V, rank) -> list[Action]:
    return one_f_one_b(P, M, 1, rank, True) if V == 1 else interleaved_1f1b(P, M, V, rank, True)


def _mirror(action: Action, P, V) -> Action:
    """The backward pass is the forward pass of the reversed pipeline (virtual stage
    s <-> V P - 1 - s): rank p <-> P - 1 - p, chunk v <-> V - 1 - v, F -> B, fwd -> bwd."""
    if action.kind == "F":
        return Action("B", V - 1 - action.chunk, action.mb)
    ops = tuple(Op(o.kind.replace("fwd", "bwd"), V - 1 - o.chunk, o.mb, P - 1 - o.peer) for o in action.ops)
    return Action("comm", ops=ops)


def gpipe(P, M, V, rank, forward_only=False) -> list[Action]:
    """All forward, then all backward (GPipe): every microbatch in flight at once."""
    _check(V == 1 or (P >= 2 and M % P == 0), f"gpipe with V > 1 needs P >= 2 and M ({M}) a multiple of P ({P})")
    fwd = _forward_pass(P, M, V, rank)
    if forward_only:
        return fwd
    return fwd + [_mirror(a, P, V) for a in _forward_pass(P, M, V, P - 1 - rank)]


SCHEDULES = {"no_pipelining": no_pipelining, "gpipe": gpipe, "1f1b": one_f_one_b,
             "interleaved_1f1b": interleaved_1f1b, "zb_h1": zb_h1, "zb_h2": zb_h2}


def default_schedule(P: int, V: int) -> str:
    """What Megatron-LM runs: no pipelining at P = 1, interleaved 1F1B with V > 1, else 1F1B."""
    if P == 1:
        return "no_pipelining"
    return "interleaved_1f1b" if V > 1 else "1f1b"


def build_schedule(P: int, M: int, V: int, schedule: str | None = None, forward_only=False):
    """Every rank's actions: {rank: [Action]} (the simulator's input)."""
    fn = SCHEDULES[schedule or default_schedule(P, V)]
    return {rank: fn(P, M, V, rank, forward_only) for rank in range(P)}
