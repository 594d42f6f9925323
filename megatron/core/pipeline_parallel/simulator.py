"""Run schedules (schedules.py) on paper: timing, bubble, memory, and proof of no deadlock.

Communication model (the strictest one, as NCCL may behave): a comm action posts all its
messages at once and completes when every one of them has met its partner, i.e. when the
other rank has posted the matching receive (or send). Messages between a pair of ranks
must be received in the order they are sent (NCCL and gloo match them in order), so the
k-th send from a to b must be the message the k-th receive of b from a expects. A message
is named by (what, virtual stage that produced it, microbatch): a send_fwd of chunk v on
rank p carries ("act", v P + p, mb), a recv_fwd of chunk v on rank p expects
("act", v P + p - 1, mb), and likewise "grad" flowing the other way.

simulate() raises ScheduleDeadlock or ScheduleMismatch with the ranks and actions involved;
otherwise it returns a Timeline: per rank the (start, end, action) of every action, the
makespan, each rank's idle fraction, and the peak number of microbatches in flight
(forwarded, not yet backwarded; with W actions: not yet through W) per rank. A comm action
with async_sends waits only for its receives (its sends are matched all the same).
"""
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from .schedules import Action


class ScheduleDeadlock(RuntimeError):
    pass


class ScheduleMismatch(RuntimeError):
    pass


def loop_stage(rank, chunk, P):
    """Virtual stage of a rank's chunk in the usual layout: chunk v of rank p is v P + p."""
    return chunk * P + rank


def v_stage(rank, chunk, P):
    """ZB-V's layout: chunk 0 of rank p is stage p, chunk 1 is stage 2P - 1 - p."""
    return rank if chunk == 0 else 2 * P - 1 - rank


def message(op, rank, P, stage_of=loop_stage):
    """(channel (src, dst), name) of the message an op sends or expects."""
    s = stage_of(rank, op.chunk, P)
    if op.kind == "send_fwd":
        return (rank, op.peer), ("act", s, op.mb)
    if op.kind == "recv_fwd":
        return (op.peer, rank), ("act", s - 1, op.mb)
    if op.kind == "send_bwd":
        return (rank, op.peer), ("grad", s, op.mb)
    return (op.peer, rank), ("grad", s + 1, op.mb)


@dataclass
class Timeline:
    P: int
    spans: dict[int, list[tuple[float, float, Action]]]  # rank -> (start, end, action), in order
    makespan: float
    peak_in_flight: dict[int, int]

    def busy(self, rank) -> float:
        return sum(e - s for s, e, a in self.spans[rank] if a.kind in _COMPUTE)

    def idle_fraction(self, rank) -> float:
        return 1.0 - self.busy(rank) / self.makespan if self.makespan > 0 else 0.0

    @property
    def bubble(self) -> float:
        """Mean idle fraction over ranks (time not spent computing, communication included)."""
        return sum(self.idle_fraction(r) for r in self.spans) / len(self.spans)

    def window(self, rank) -> float:
        """Time from this rank's first compute action's start to its last action's end."""
        starts = [s for s, _, a in self.spans[rank] if a.kind in _COMPUTE]
        return self.spans[rank][-1][1] - starts[0] if starts else 0.0

    @property
    def steady_idle(self) -> float:
        """Idle time per iteration when iterations follow each other with no flush between
        them (each rank starts the next as soon as it is done: the paper's "parallelogram",
        which needs the optimizer's post-validation): max over ranks of window - busy."""
        return max(self.window(r) - self.busy(r) for r in self.spans)


_COMPUTE = ("F", "B", "W")


def uniform_costs(forward=1.0, backward=2.0, comm=0.0, V=1):
    """Cost function with the whole stage's forward costing `forward` (each chunk 1/V of it).
    W actions cost nothing here (B is the whole backward): use fbw_costs to split it."""
    def cost(rank, action):
        if action.kind == "F":
            return forward / V
        if action.kind == "B":
            return backward / V
        return 0.0 if action.kind == "W" else comm
    return cost


def fbw_costs(forward, backward, weight, comm=0.0, V=1, split=True):
    """Costs of a stage's F, B (input gradient) and W (weight gradients), each chunk 1/V of
    them; split=False for schedules without W actions, whose B then costs backward + weight."""
    def cost(rank, action):
        if action.kind == "comm":
            return comm
        t = {"F": forward, "B": backward if split else backward + weight, "W": weight}[action.kind]
        return t / V
    return cost


def simulate(actions: dict[int, list[Action]], cost: Callable | None = None, stage_of=loop_stage,
             streams=False) -> Timeline:
    """Run every rank's action list; cost(rank, action) -> seconds (default uniform_costs()).
    stage_of(rank, chunk, P) -> virtual stage: loop_stage, or v_stage for ZB-V. streams: the
    activations and the gradients between two ranks are two channels, each in order (e.g. two
    process groups), instead of one."""
    P = len(actions)
    cost = cost or uniform_costs()
    pos = dict.fromkeys(actions, 0)
    clock = dict.fromkeys(actions, 0.0)
    spans = {r: [] for r in actions}
    sent = defaultdict(list)      # channel -> [(name, post time, rank, action index)]
    received = defaultdict(list)  # channel -> same, for receives
    posted = {}                   # rank -> [(channel, index, is_send)] of its current comm action
    in_flight = dict.fromkeys(actions, 0)
    freed_by = {r: "W" if any(a.kind == "W" for a in acts) else "B" for r, acts in actions.items()}
    peak = dict.fromkeys(actions, 0)
    while True:
        progress = False
        for r in actions:
            while pos[r] < len(actions[r]):
                a = actions[r][pos[r]]
                if a.kind in _COMPUTE:
                    in_flight[r] += 1 if a.kind == "F" else -1 if a.kind == freed_by[r] else 0
                    peak[r] = max(peak[r], in_flight[r])
                    end = clock[r] + cost(r, a)
                else:
                    if r not in posted:
                        posted[r] = []
                        for op in a.ops:
                            channel, name = message(op, r, P, stage_of)
                            channel = channel + (name[0],) if streams else channel
                            queue = sent if op.kind.startswith("send") else received
                            queue[channel].append((name, clock[r], r, pos[r]))
                            posted[r].append((channel, len(queue[channel]) - 1, op.kind.startswith("send")))
                            _check_match(sent[channel], received[channel], channel, actions)
                    start = clock[r]
                    for channel, i, is_send in posted[r]:
                        if is_send and a.async_sends:
                            continue
                        other = received[channel] if is_send else sent[channel]
                        if i >= len(other):
                            break
                        start = max(start, other[i][1])
                    else:
                        del posted[r]
                        end = start + cost(r, a)
                        spans[r].append((clock[r], end, a))
                        clock[r], pos[r], progress = end, pos[r] + 1, True
                        continue
                    break  # some partner has not posted yet: this rank waits
                spans[r].append((clock[r], end, a))
                clock[r], pos[r], progress = end, pos[r] + 1, True
        if all(pos[r] == len(actions[r]) for r in actions):
            break
        if not progress:
            stuck = {r: actions[r][pos[r]] for r in actions if pos[r] < len(actions[r])}
            raise ScheduleDeadlock("deadlock: every unfinished rank waits on a message no one will send/receive: "
                                   + "; ".join(f"rank {r} at action {pos[r]} {a!r}" for r, a in stuck.items()))
    leftover = [(c, len(sent[c]), len(received[c])) for c in set(sent) | set(received)
                if len(sent[c]) != len(received[c])]
    if leftover:
        raise ScheduleMismatch("unmatched messages (channel, sends, receives): " + repr(sorted(leftover)))
    makespan = max((clock[r] for r in actions), default=0.0)
    return Timeline(P, spans, makespan, peak)


def _check_match(sends, recvs, channel, actions):
    n = min(len(sends), len(recvs)) - 1
    if n >= 0 and sends[n][0] != recvs[n][0]:
        (sname, _, sr, si), (rname, _, rr, ri) = sends[n], recvs[n]
        raise ScheduleMismatch(
            f"message {n} on channel {channel[0]}->{channel[1]}: rank {sr} sends {sname} "
            f"(action {si} {actions[sr][si]!r}) but rank {rr} expects {rname} (action {ri} {actions[rr][ri]!r})")


def check_complete(actions: dict[int, list[Action]], M: int, V: int, forward_only=False) -> None:
    """Every (chunk, microbatch) is forwarded, and backwarded, exactly once per rank,
    and never backwarded before its forward; where a rank has W actions, each (chunk,
    microbatch) has one, after its B. Raises AssertionError."""
    want = sorted((v, m) for v in range(V) for m in range(M))
    for r, acts in actions.items():
        fwd = [(a.chunk, a.mb) for a in acts if a.kind == "F"]
        bwd = [(a.chunk, a.mb) for a in acts if a.kind == "B"]
        assert sorted(fwd) == want, f"rank {r}: forwards {fwd}"
        assert sorted(bwd) == ([] if forward_only else want), f"rank {r}: backwards {bwd}"
        wgt = [(a.chunk, a.mb) for a in acts if a.kind == "W"]
        assert not wgt or sorted(wgt) == want, f"rank {r}: weight gradients {wgt}"
        done = set()
        for a in acts:
            if a.kind == "F":
                done.add((a.chunk, a.mb))
            elif a.kind == "B":
                assert (a.chunk, a.mb) in done, f"rank {r}: {a!r} before its forward"
                done.add(("B", a.chunk, a.mb))
            elif a.kind == "W":
                assert ("B", a.chunk, a.mb) in done, f"rank {r}: {a!r} before its input gradient"


def predicted_bubble(P: int, M: int, V: int = 1) -> float:
    """Idle fraction of (interleaved) 1F1B with uniform stages and free communication:
    (P - 1) / (V M + P - 1); V = 1 is the 1F1B / GPipe figure (P - 1) / (M + P - 1)."""
    return (P - 1) / (V * M + P - 1)
