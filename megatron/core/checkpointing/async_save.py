"""--async-save: the write, fsync, checksums and atomic commit of a save run in a background thread.

The training step waits only for the state's copy to host memory (pieces.make_piece clones to
CPU); this worker then runs the same storage.py steps a synchronous save runs, so the commit
protocol and its fault points are unchanged and a kill during the background write leaves the
previous checkpoint named (reading.py finds it).

A thread, not a process: the captured state is already in this process's host memory, and a
process would have to pickle or share it first (one more copy of the whole state) and set up its
own process group. The thread spends its time in file writes, fsync and zlib.crc32, which release
the GIL, so the training loop keeps running. Its barriers go through a process group of their
own (gloo, made once by every rank at start): collectives of the training step and of the save
then never interleave on one group.

A run that raises while a save is in flight waits for it before the exception leaves
`finishing_saves()` (launch.run_pretrain wraps training in it): the exit paths end with
os._exit or destroy the process groups, either of which would kill the background write.
"""
import contextlib
import sys
import threading
import time
import weakref

import torch.distributed as dist

# every AsyncSaver of this process, for finishing_saves() at exit (the exit path holds no saver); weak, so a
# saver the run dropped goes with it
_savers = weakref.WeakSet()


class AsyncSaver:
    """At most one save in flight. submit() waits for the previous save first; wait() returns
    when none is in flight and re-raises the error of a failed one (e.g. CheckpointError)."""

    def __init__(self):
        # every rank, in the same order (a collective): the group the background barriers use
        self.group = dist.new_group(backend="gloo")
        self._thread, self._error = None, None
        _savers.add(self)

    def submit(self, write):
        """Run write() (no arguments; its barriers on self.group) in the background.
        -> seconds spent waiting for the previous save."""
        start = time.perf_counter()
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(write,), name="async-checkpoint-save")
        self._thread.start()
        return time.perf_counter() - start

    def _run(self, write):
        try:
            write()
        except BaseException as e:  # handed to the training thread at its next wait()
            self._error = e

    def wait(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    @property
    def in_flight(self):
        return self._thread is not None and self._thread.is_alive()


@contextlib.contextmanager
def finishing_saves():
    """Run the block; if it raises while a background save is in flight, wait for that save to
    commit (a failure of the save itself is printed, not raised over the block's exception)."""
    try:
        yield
    except BaseException:
        for saver in list(_savers):
            if saver._thread is None:
                continue
            print("> training raised while a checkpoint is being written in the background (--async-save): "
                  "waiting for it to commit", file=sys.stderr, flush=True)
            try:
                saver.wait()
            except BaseException as e:  # the save's own failure; the block's error is the one to raise
                print(f"> the background checkpoint save failed too: {e}", file=sys.stderr, flush=True)
        raise
