"""The suite's launcher for command lines expected to succeed: one process that has imported torch and
megatron once, and forks a fresh child per command line, or per rank of one (as torchrun would start
them), instead of paying 2-3 s of interpreter and torch start for torchrun and again for every rank.

    python -m tests.functional.zygote      # started by cli.py; requests on stdin, replies on stdout

A request is a JSON line {"script", "args", "nproc", "env", "cwd", "stdout", "stderr"} (output file
paths); the replies are {"pid": launcher} at once, then {"code": exit code}. The launcher child starts a
new session (a timeout kills the group), takes the request's environment and output files, and runs the
script as `python script args` would (a single process) or forks nproc ranks with torchrun's variables
and a fresh rendezvous port, ending the others when one fails, as torchrun does. Every process ends
through the interpreter's normal exit (atexit handlers, non-daemon threads, flushes).

What differs from fresh interpreters: the ranks share the zygote's string-hash seed, and what torch or
megatron read from the environment at import is the zygote's. So cli.py sends a run here only when the
test set no variable read at import (IMPORT_TIME_PREFIXES), starts a new zygote when its own process's
such variables change, and sends nothing with MEGATRON_TEST_LAUNCHER=torchrun; the failure-path tests
(bad input, hangs, crashes) always run through torchrun.
"""
import json
import os
import runpy
import signal
import sys
import time

from tests.harness import free_port

from .forked import PRELOAD, REPO

# variables torch, OpenMP or Python read at start or import: a request must match the zygote's in these
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH", "PYTORCH_", "PYTHON", "LD_", "CUDA", "MALLOC_")


def import_time_environment(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


def _run_script(script, args):
    """Become `python script args`; ends the process by SystemExit through the interpreter's exit."""
    import numpy as np
    np.random.seed()  # a fresh interpreter seeds it from the OS; a fork copies it (`random` reseeds itself)
    sys.argv = [script] + list(args)
    runpy.run_path(os.path.join(REPO, script), run_name="__main__")
    sys.exit(0)


def _stop(pids, grace=5.0):
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            pids.discard(pid)
        else:
            time.sleep(0.05)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _launch(request):
    os.setsid()
    with open(os.devnull) as null:
        os.dup2(null.fileno(), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        with open(path, "wb") as f:
            os.dup2(f.fileno(), fd)
    sys.stdin = open(os.devnull)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script, args, nproc = request["script"], request["args"], request["nproc"]
    if nproc == 1:
        _run_script(script, args)
    port = str(free_port())
    ranks = {}
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank),
                              WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), ROLE_WORLD_SIZE=str(nproc),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCHELASTIC_RESTART_COUNT="0",
                              TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_RUN_ID="zygote")
            _run_script(script, args)
        ranks[pid] = rank
    code, running = 0, set(ranks)
    while running:
        pid, status = os.wait()
        running.discard(pid)
        exit_code = os.waitstatus_to_exitcode(status)
        if exit_code != 0 and code == 0:
            print(f"zygote: rank {ranks[pid]} exited with {exit_code}; stopping the others", file=sys.stderr)
            sys.stderr.flush()
            code = 1  # torchrun's exit code when a rank fails
            _stop(running)
            running = set()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _reply(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def main():
    os.chdir(REPO)
    sys.path.insert(0, REPO)
    for name in PRELOAD:
        __import__(name)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _launch(request)  # never returns: the child exits through it
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"code": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
