"""The vocabulary of schedules (schedules.py, zero_bubble.py): messages (Op), actions (Action)
and the builder that numbers one rank's messages."""
from dataclasses import dataclass

from ..errors import ScheduleError

_ORDER = {"send_fwd": 0, "recv_fwd": 1, "send_bwd": 2, "recv_bwd": 3}


@dataclass(frozen=True)
class Op:
    kind: str   # send_fwd | recv_fwd | send_bwd | recv_bwd
    chunk: int
    mb: int
    peer: int   # pipeline rank at the other end


@dataclass(frozen=True)
class Action:
    kind: str   # F | B | W | comm
    chunk: int = 0
    mb: int = 0
    ops: tuple[Op, ...] = ()
    async_sends: bool = False  # comm: wait only for the receives; sends complete by the step's end

    def timer_name(self):
        """Megatron-LM's level-2 timer for this action: forward-compute, backward-compute (B and W),
        or the p2p timer named for the directions its messages go (one name per set of op kinds)."""
        if self.kind != "comm":
            return "forward-compute" if self.kind == "F" else "backward-compute"
        words = {"send_fwd": "forward-send", "send_bwd": "backward-send", "recv_fwd": "forward-recv",
                 "recv_bwd": "backward-recv"}
        sends = [k for k in ("send_fwd", "send_bwd") if any(o.kind == k for o in self.ops)]
        recvs = [k for k in ("recv_fwd", "recv_bwd") if any(o.kind == k for o in self.ops)]
        if len(sends) > 1 or len(recvs) > 1:
            return "forward-backward-send-forward-backward-recv"
        if sends and recvs:  # e.g. forward-send-backward-recv
            return f"{words[sends[0]]}-{words[recvs[0]]}"
        return words[(sends or recvs)[0]]

    def __repr__(self):
        if self.kind == "comm":
            return "comm(" + ", ".join(f"{o.kind}[{o.chunk},{o.mb}]->{o.peer}" for o in self.ops) + ")"
        return f"{self.kind}[{self.chunk},{self.mb}]"


class _Builder:
    """Collects one rank's actions; the op helpers return None where no message exists
    (no input on the first virtual stage, no gradient into the last)."""

    def __init__(self, P, V, rank, forward_only):
        self.P, self.V, self.rank, self.forward_only = P, V, rank, forward_only
        self.actions: list[Action] = []
        self.next_in = [0] * V    # next microbatch whose activation each chunk receives
        self.next_grad = [0] * V  # ... and whose output gradient

    def _first(self, v):
        return v == 0 and self.rank == 0

    def _last(self, v):
        return v == self.V - 1 and self.rank == self.P - 1

    def send_fwd(self, v, mb):
        return None if self._last(v) else Op("send_fwd", v, mb, (self.rank + 1) % self.P)

    def send_bwd(self, v, mb):
        return None if self._first(v) else Op("send_bwd", v, mb, (self.rank - 1) % self.P)

    def recv_fwd(self, v):
        """The next activation chunk v receives (microbatches arrive in order per chunk)."""
        if self._first(v):
            return None
        self.next_in[v] += 1
        return Op("recv_fwd", v, self.next_in[v] - 1, (self.rank - 1) % self.P)

    def recv_bwd(self, v):
        if self._last(v) or self.forward_only:
            return None
        self.next_grad[v] += 1
        return Op("recv_bwd", v, self.next_grad[v] - 1, (self.rank + 1) % self.P)

    def comm(self, *ops):
        ops = tuple(sorted((o for o in ops if o is not None), key=lambda o: _ORDER[o.kind]))
        if ops:
            self.actions.append(Action("comm", ops=ops))

    def F(self, v, mb):
        self.actions.append(Action("F", v, mb))

    def B(self, v, mb):
        self.actions.append(Action("B", v, mb))


def _check(cond, message):
    if not cond:
        raise ScheduleError(message)
