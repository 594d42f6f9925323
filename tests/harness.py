"""Run a function on N real processes with torch.distributed (gloo) and the rank grid built.

    from tests.harness import spawn

    def body(groups, x):          # groups: megatron.core.parallel_state.ProcessGroups
        ...                       # runs on every rank; may return a picklable value
    results = spawn(4, body, 3.0, tp=2, pp=2)   # -> [value of rank 0, value of rank 1, ...]

Every rank is a fresh process (start method "spawn"), so `fn` must be importable by
reference: a module-level function of an importable module (a test module is fine).
If any rank raises, spawn raises AssertionError with that rank's full traceback; it never
hangs: after `timeout` seconds every rank still running is killed and spawn raises.
"""
from __future__ import annotations

import datetime
import os
import queue as queue_mod
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT = 120.0


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, tp, pp, timeout, fn, args, results):
    # imported here so a broken library shows up as this rank's traceback
    try:
        from megatron.core import parallel_state
        torch.set_num_threads(1)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        try:
            groups = parallel_state.initialize_model_parallel(tp, pp)
            value = fn(groups, *args)
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()  # the default group and every sub-group
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        results.put((rank, False, traceback.format_exc()))


def spawn(world_size, fn, *args, tp=1, pp=1, timeout=DEFAULT_TIMEOUT):
    """Run fn(groups, *args) on world_size processes; return the per-rank return values.

    Raises AssertionError naming the failing rank(s) with their tracebacks if any rank
    raises, exits without reporting (crash), or the run exceeds `timeout` seconds.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(r, world_size, port, tp, pp, timeout, fn, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()

    values, errors = {}, {}
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while len(values) + len(errors) < world_size:
            if errors:
                break  # the other ranks may be stuck in a collective with the failed one
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                reported = set(values) | set(errors)
                for r, p in enumerate(procs):
                    # a rank that died without reporting (segfault, os._exit, OOM kill);
                    # give its queue feeder a moment in case the report is in flight
                    if r not in reported and p.exitcode is not None:
                        try:
                            rank, ok, payload = results.get(timeout=1.0)
                        except queue_mod.Empty:
                            errors[r] = f"process exited with code {p.exitcode} without reporting"
                        else:
                            (values if ok else errors)[rank] = payload
                        break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                continue
            (values if ok else errors)[rank] = payload
    finally:
        for p in procs:
            if p.is_alive() and (errors or timed_out):
                p.kill()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()

    if errors or timed_out:
        lines = [f"spawn({world_size}, {getattr(fn, '__name__', fn)}, tp={tp}, pp={pp}) failed"]
        if timed_out:
            missing = sorted(set(range(world_size)) - set(values) - set(errors))
            lines.append(f"timed out after {timeout:.0f} s; ranks still running: {missing}")
        for r in sorted(errors):
            lines.append(f"----- rank {r} -----\n{errors[r]}")
        raise AssertionError("\n".join(lines))
    return [values[r] for r in range(world_size)]
