"""Run a function on N real processes with torch.distributed (gloo) and the rank grid built.

    from tests.harness import spawn

    def body(groups, x):          # groups: megatron.core.process_groups.ProcessGroups
        ...                       # runs on every rank; may return a picklable value
    results = spawn(4, body, 3.0, tp=2, pp=2)   # -> [value of rank 0, value of rank 1, ...]

Every rank is a fresh process forked from multiprocessing's fork server, which has imported torch and
megatron once (a spawned interpreter would import them again per rank, 2-3 s each), with the calling
process's environment of the moment; `fn` must be importable by reference: a module-level function of
an importable module (a test module is fine).
If any rank raises, spawn raises AssertionError with that rank's full traceback; it never
hangs: after `timeout` seconds every rank still running is killed and spawn raises.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import pickle
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


# imported once by the fork server; everything a rank imports beyond these it imports itself
PRELOAD = ["torch", "numpy", "pytest", "tests.harness", "megatron.core.parallel_layout", "megatron.core.models.gpt",
           "megatron.training.loop.training"]


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _worker(rank, world_size, port, tp, pp, timeout, fn, args, results, sizes, environ):
    os.environ.clear()  # the caller's variables now, not the fork server's at its start
    os.environ.update(environ)

    def cleanup():
        if dist.is_initialized():
            dist.destroy_process_group()  # the default group and every sub-group

    try:
        from megatron.core.parallel_layout import ParallelLayout  # here: an import error is this rank's traceback
        torch.set_num_threads(1)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        groups = ParallelLayout(world_size, tp=tp, pp=pp, **sizes).build_groups()
        value = fn(groups, *args)
        cleanup()
    except BaseException:  # everything goes back to the parent
        # report before tearing down: the teardown makes the peers fail too, and the
        # parent should hear about the root cause first
        results.put((rank, False, traceback.format_exc()))
        with contextlib.suppress(BaseException):
            cleanup()
        return
    # pickled to bytes here: a tensor put as itself travels as a file descriptor the parent fetches from this
    # process, which may have exited by then (ConnectionResetError in the parent)
    results.put((rank, True, pickle.dumps(value)))


def spawn(world_size, fn, *args, tp=1, pp=1, timeout=DEFAULT_TIMEOUT, **sizes):
    """Run fn(groups, *args) on world_size processes; return the per-rank return values. sizes: the
    other ParallelLayout fields (schedule="zb_v": ZB-V's gradient group).

    Raises AssertionError naming the failing rank(s) with their tracebacks if any rank
    raises, exits without reporting (crash), or the run exceeds `timeout` seconds.
    """
    for attempt in range(3):
        try:
            return _spawn_once(world_size, fn, args, tp, pp, timeout, sizes)
        except AssertionError as e:
            # set-up, not the code under test, failed: the free port was taken before rank 0
            # bound it, or gloo's mesh connect was dropped on an overloaded machine; go again
            setup_failed = any(k in str(e).lower() for k in ("address already in use", "connectfullmesh"))
            if not setup_failed or attempt == 2:
                raise


def _spawn_once(world_size, fn, args, tp, pp, timeout, sizes):
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(r, world_size, port, tp, pp, timeout, fn, args, results, sizes, dict(os.environ)))
             for r in range(world_size)]
    for p in procs:
        p.start()

    values, errors, failed_order, exited_at = {}, {}, [], {}
    deadline = time.monotonic() + timeout
    grace_end = None  # after the first failure, a moment for the other ranks' reports
    timed_out = False
    try:
        while len(values) + len(errors) < world_size:
            now = time.monotonic()
            if grace_end is not None and now > grace_end:
                break
            if now > deadline:
                timed_out = True
                break
            try:
                rank, ok, payload = results.get(timeout=0.1)
            except queue_mod.Empty:
                for r, p in enumerate(procs):
                    # died without reporting (segfault, os._exit, OOM kill); a report
                    # may still be in the pipe, so give it a moment
                    if r in values or r in errors or p.exitcode is None:
                        continue
                    exited_at.setdefault(r, now)
                    if now - exited_at[r] > 2.0:
                        errors[r] = f"process exited with code {p.exitcode} without reporting"
                        failed_order.append(r)
            else:
                (values if ok else errors)[rank] = pickle.loads(payload) if ok else payload
                if not ok:
                    failed_order.append(rank)
            if errors and grace_end is None:
                grace_end = time.monotonic() + 3.0
    finally:
        # kill whatever is left unless every rank reported success (also on Ctrl-C)
        all_ok = len(values) == world_size
        for p in procs:
            if p.is_alive() and not all_ok:
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
        if failed_order:
            lines.append(f"ranks in the order they failed: {failed_order} (the first is usually the cause)")
        for r in failed_order:
            lines.append(f"----- rank {r} -----\n{errors[r]}")
        raise AssertionError("\n".join(lines))
    return [values[r] for r in range(world_size)]
