"""Debug hooks for tests and fault drills: injected faults and counted collective traffic.

Neither changes what a run computes, and both cost nothing while off: a fault point is one
environment lookup at a rare moment (a checkpoint save), a traffic record one loop over an
empty list. Library code calls only `fault_point` and `record_traffic`; tests and operators
turn them on.

Fault points. Code marks the moments where a crash matters with
`fault_point(name, iteration, rank)`. Setting

    MEGATRON_DEBUG_FAULT=<name>[:<iteration>[:<rank>[:<action>[:<attempt>]]]][,<more entries>]

makes the matching point act: an empty or `*` field matches any iteration, rank or attempt. The
attempt is torchrun's restart count (TORCHELASTIC_RESTART_COUNT, 0 for the first launch), so a
fault can fire in the first attempt only and the restarted group run through. Actions:

    kill    (default) SIGKILL this process, exactly as `kill -9` would: nothing is flushed,
            no handler runs; a torchrun job's other ranks are then stopped by torchrun
    enospc  raise OSError(ENOSPC), as a full disk does inside a write
    raise   raise InjectedFault: a crash simulated inside one process (unit tests), the
            disk left as a kill would leave it
    stop    SIGSTOP this process, as a frozen rank (a hung host, a stuck driver) is: its peers
            then wait for it (megatron/core/watchdog.py stops them); it says so on stderr first
    eio     raise OSError(EIO), as a failing disk or a storage hiccup does inside a write
    corrupt overwrite 4 KiB in the middle of the file the point names (a rank file just written,
            with its checksum already taken): silent corruption that the next read finds
    slow    compute for 0.5 s (MEGATRON_DEBUG_SLOW_SECONDS; a busy loop, not a sleep): a straggling host
    nan     returned to the caller, which acts: the training step turns this rank's gradients
            into NaN at `train.grads` (a faulty device)

Points where the caller acts return the action's name (a string) when they match, else None.

e.g. `MEGATRON_DEBUG_FAULT=ckpt.rename.after:4` kills the save of iteration 4 after the new
checkpoint directory is in place and before the tracker names it. The checkpoint points,
in the order a save passes them, are listed in megatron/core/checkpointing/storage.py;
`train.iteration` is passed at the start of every training iteration, `train.grads` after its
backward (before the gradients are reduced), `train.forward_backward` at its start with --log-straggler.
docs/fault_tolerance.md has worked examples.

Timeout. `MEGATRON_DEBUG_TIMEOUT_SECONDS=S` replaces --distributed-timeout-minutes by S
seconds (a float), so that tests of the hang watchdog take seconds, not minutes.

Traffic. `with count_traffic() as sent: ...` counts, per tag, the bytes this process sends
through the tagged collectives of megatron/core/comm.py inside the block (ring-algorithm
figures; see comm.py), so tests can compare the traffic against theory.
"""
import collections
import contextlib
import errno
import os
import signal
import sys
import time

FAULT_ENV = "MEGATRON_DEBUG_FAULT"
TIMEOUT_ENV = "MEGATRON_DEBUG_TIMEOUT_SECONDS"


class InjectedFault(Exception):
    """A `raise` fault point fired (never caught by library code)."""


def _kill(name):
    os.kill(os.getpid(), signal.SIGKILL)


def _enospc(name):
    raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected at {name})")


def _raise(name):
    raise InjectedFault(name)


def _eio(name):
    raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (injected at {name})")


def _corrupt(name, path=None):
    if path is None or not os.path.isfile(path):
        raise ValueError(f"{FAULT_ENV}: the point {name} names no file to corrupt")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(max(0, size // 2 - 2048))
        f.write(b"\xab" * min(4096, size))


def _slow(name):
    end = time.thread_time() + float(os.environ.get("MEGATRON_DEBUG_SLOW_SECONDS", "0.5"))
    while time.thread_time() < end:  # CPU time, as a slow device's compute costs
        pass


def _stop(name):
    print(f"debug: process {os.getpid()} stops itself (SIGSTOP) at {name}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


_ACTIONS = {"kill": _kill, "enospc": _enospc, "raise": _raise, "stop": _stop, "eio": _eio, "corrupt": _corrupt,
            "slow": _slow}
_RETURNED = ("nan",)  # the caller acts


def timeout_seconds(minutes):
    """The distributed timeout in seconds: MEGATRON_DEBUG_TIMEOUT_SECONDS when set, else `minutes`."""
    override = os.environ.get(TIMEOUT_ENV)
    return float(override) if override else 60.0 * minutes


def _matches(field, value):
    return field in ("", "*") or (value is not None and field == str(value))


def fault_point(name, iteration=None, rank=None, path=None):
    """Act (see the module docstring) when MEGATRON_DEBUG_FAULT names this point for this
    iteration, rank and attempt; return at once otherwise. -> the name of a matching action the
    caller performs (nan), else None. path: the file a `corrupt` action damages. Talks to no
    process group."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    for entry in spec.split(","):
        point, it, rk, action, at = (entry.strip().split(":") + ["", "", "", ""])[:5]
        if action not in ("", *_ACTIONS, *_RETURNED):
            raise ValueError(f"{FAULT_ENV}={spec!r}: unknown action {action!r} "
                             f"(one of {', '.join((*_ACTIONS, *_RETURNED))})")
        if point == name and _matches(it, iteration) and _matches(rk, rank) and _matches(at, attempt):
            if action in _RETURNED:
                return action
            if action == "corrupt":
                _corrupt(name, path)
            else:
                _ACTIONS[action or "kill"](name)
    return None


# the open count_traffic() counters, innermost last. Module state so that comm.py's collectives can report
# without a counter passed through every layer; bounded by the nesting of the with-blocks, each popped on exit
_recorders = []


@contextlib.contextmanager
def count_traffic():
    """Inside the block, count the bytes sent per tag: yields a collections.Counter
    {tag: bytes} that fills as tagged collectives run. Blocks may nest; each counts."""
    counter = collections.Counter()
    _recorders.append(counter)
    try:
        yield counter
    finally:
        _recorders.remove(counter)


def record_traffic(tag, sent_bytes):
    """Called by megatron/core/comm.py at each tagged collective; a no-op outside count_traffic()."""
    for counter in _recorders:
        counter[tag] += sent_bytes
