"""Stop a rank, with one line, when it waits too long for its peers (--distributed-timeout-minutes).

A frozen or dead rank otherwise leaves every other rank blocked in its next collective or
pipeline receive, silently, until the process group's own timeout raises a message that names
neither the operation nor the peer. Here the code arms a deadline around each blocking wait
(`with waiting("all-reduce (dp-grads)", group=...)`: megatron/core/comm.py, the pipeline
p2p exchange); one daemon thread per process, started by start(), checks the armed wait about
twenty times per limit and, once it is older than the limit, writes

    error: rank 0 waited 600 s in pipeline send/receive for rank 1 (receive from 1); ...

to stderr and ends the process at once (os._exit, exit code EXIT_HANG: a blocked main thread
cannot be interrupted politely, and nothing of a half-done iteration is worth saving). The
process group's timeout is set a little longer (initialize.py), as a backstop for waits not
armed here; a gloo error raised inside an armed wait (its timeout, or a peer that closed the
connection by exiting) is turned into the same line.

Arming costs one tuple assignment per wait. With NCCL, collectives return before the GPU
finishes them, so the watchdog sees host-side waits only; NCCL's own watchdog (the process
group timeout) covers the device side.
"""
import os
import sys
import threading
import time
import traceback

import torch.distributed as dist

EXIT_HANG = 3  # our own code: no Megatron-LM equivalent (its hangs end in the NCCL watchdog's abort)
EXIT_USER_ERROR = 2  # bad input (training/loop/launch.py)

# One watchdog per process, watching its main thread (the one that waits on collectives): two values, never a
# collection, set by start() once and by each armed wait
_current = None  # (start time, waiting) of the main thread's armed wait, None when none is
_limit = None  # seconds, once start() ran


def start(limit_seconds: float) -> None:
    """Start the watchdog thread of this process (once) with a limit in seconds."""
    global _limit
    if _limit is not None:
        return
    _limit = float(limit_seconds)
    threading.Thread(target=_watch, args=(min(1.0, _limit / 20),), name="megatron-watchdog", daemon=True).start()


def _watch(poll):
    while True:
        time.sleep(poll)
        current = _current
        if current is not None and time.monotonic() - current[0] > _limit:
            current[1].fire(f"waited {_limit:g} s")


def _ranks(group):
    try:
        return dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    except (RuntimeError, ValueError):
        return "?"


class waiting:
    """Context manager arming the deadline for one blocking wait of the main thread.

    op: what is waited in ("all-reduce (dp-grads)"); group: the process group of a collective;
    p2p: for a pipeline exchange, [(kind, global peer rank)] with kind "send" or "recv"."""

    __slots__ = ("op", "group", "p2p", "prev", "t0")

    def __init__(self, op, group=None, p2p=None):
        self.op, self.group, self.p2p = op, group, p2p

    def __enter__(self):
        global _current
        self.t0 = time.monotonic()
        self.prev, _current = _current, (self.t0, self)
        return self

    def __exit__(self, kind, exc, tb):
        global _current
        _current = self.prev
        if isinstance(exc, RuntimeError) and _limit is not None and _is_comm_error(exc):
            self.fire(f"failed after {time.monotonic() - self.t0:.0f} s ({_first_line(exc)})")
        return False

    def describe(self):
        if self.p2p is not None:
            peers = sorted({peer for _, peer in self.p2p})
            parts = ", ".join(f"{'receive from' if k == 'recv' else 'send to'} {p}" for k, p in self.p2p)
            return f"{self.op} for rank{'s' if len(peers) > 1 else ''} {', '.join(map(str, peers))} ({parts})"
        return f"{self.op} over the group of ranks {_ranks(self.group)}"

    def fire(self, what):
        """Write the one line and end this process (exit code EXIT_HANG); silently (EXIT_USER_ERROR)
        when the peer stopped on bad input it reported itself."""
        _exit_if_a_peer_reported()
        rank = dist.get_rank() if dist.is_initialized() else 0
        line = (f"error: rank {rank} {what} in {self.describe()}: a peer is stopped, hung or dead "
                f"(limit: --distributed-timeout-minutes)\n")
        try:
            sys.stdout.flush()
        finally:
            os.write(2, line.encode())
            os._exit(EXIT_HANG)


def unarmed_failure(exc, rank) -> None:
    """For a communication error raised in a wait not armed here (the process group's own
    timeout fired first): write the one line, naming the innermost frame of ours, and end the
    process (EXIT_HANG). Returns for any other exception."""
    if _limit is None or not isinstance(exc, RuntimeError) or not _is_comm_error(exc):
        return
    _exit_if_a_peer_reported()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}megatron{os.sep}" in f.filename]
    where = (f"{frames[-1].name} ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})"
             if frames else "a collective")
    os.write(2, f"error: rank {rank} timed out in {where}: {_first_line(exc)}; a peer is stopped, hung or dead "
                f"(limit: --distributed-timeout-minutes)\n".encode())
    os._exit(EXIT_HANG)


def _is_comm_error(exc):
    text = str(exc).lower()
    return any(k in text for k in ("timed out", "timeout", "connection closed", "connection reset", "broken pipe"))


def _first_line(exc):
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


# Bad input found by one rank after start-up (a shard only it reads, a write only it fails) is printed
# by the first rank that finds some, whichever it is: ranks claim the report through the default group's
# store (an atomic counter, outside every process group, alive while any rank is), and a rank whose wait
# fails because such a peer exited leaves silently instead of calling the peer hung.

def _user_error_key():  # one per torchrun attempt: a restarted job's ranks report afresh
    return f"megatron/user-error/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _store():
    return dist.distributed_c10d._get_default_store()


def claim_user_error() -> bool:
    """True for the first rank of the job to report bad input (it prints the line), False for the
    others. Without torch.distributed, a world of one, or no reachable store: True (twice beats never)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    try:
        return _store().add(_user_error_key(), 1) == 1
    except Exception:  # the store's host went first (no torchrun agent): say it here too
        return True


def _exit_if_a_peer_reported():
    try:
        reported = dist.is_initialized() and _store().add(_user_error_key(), 0) > 0
    except Exception:
        reported = False
    if reported:
        sys.stdout.flush()
        os._exit(EXIT_USER_ERROR)
