"""Running pretrain_gpt.py as a user would (python, or torchrun for several ranks) and reading its log."""
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

from .zygote import import_time_environment

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The trainer's defaults these tests were written against; Megatron-LM's defaults differ (issue 14). Prepended
# to the trainers' flags (a test's own flags, given after, override them); the no-argument run is the
# embedded recipe, which pins the same values itself.
PINNED = ["--train-iters", "200", "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
          "--lr-warmup-iters", "20", "--lr-wsd-decay-style", "linear", "--weight-decay", "0.1", "--adam-beta2", "0.95",
          "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10"]
# MEGATRON_TEST_FLAGS: trainer flags added to PINNED for a whole test run (a test's own flags still
# come after), e.g. "--cross-entropy-loss-fusion" runs every CLI test, references included, fused
PINNED += os.environ.get("MEGATRON_TEST_FLAGS", "").split()
LOSS_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| lm loss: ([0-9.Ee+-]+|nan) \|")


def run_environment(extra=None):
    """The environment a run gets: this process's, one thread per rank (ranks share the cores, and
    references compare alike), the repository importable, then the test's own variables."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            **(extra or {})}


def run_cli(args, nproc=1, script="pretrain_gpt.py", timeout=600, check=True, env=None, pinned=True):
    """Run the script; nproc > 1 goes through torchrun --standalone. env: extra variables. A trainer
    given flags gets PINNED before them (unless not `pinned`). Returns CompletedProcess."""
    if pinned and args and script in ("pretrain_gpt.py", "pretrain_bert.py"):
        args = PINNED + list(args)
    env = run_environment(env)
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script]
    else:
        cmd = [sys.executable, script]
    if check and _ZYGOTE.accepts(env):
        proc = _ZYGOTE.run(cmd + list(args), script, list(args), nproc, env, timeout)
    else:
        proc = subprocess.run(cmd + list(args), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd + list(args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}")
    return proc


def port_taken(stderr):
    """Whether a failed run's stderr says its rendezvous port was in use (c10d's TCPStore, EADDRINUSE)."""
    return "address already in use" in stderr.lower()


class _Zygote:
    """tests/functional/zygote.py, started at the first run that can use it and ended with the test process
    (its stdin closes). Runs expected to fail keep torchrun and fresh interpreters: their exit codes and
    one-line errors are what users see."""

    def __init__(self):
        self.proc, self.env, self.pending = None, None, b""

    def accepts(self, env):
        """Whether a run with this environment can start here: not where the test set variables read at
        import (those get a fresh interpreter). A zygote started before this process's own such
        variables changed is replaced."""
        if os.environ.get("MEGATRON_TEST_LAUNCHER", "zygote") == "torchrun":
            return False
        base = run_environment()
        if import_time_environment(env) != import_time_environment(base):
            return False
        if self.proc is not None and (self.proc.poll() is not None or
                                      import_time_environment(self.env) != import_time_environment(base)):
            self.proc.stdin.close()
            self.proc.wait()
            self.proc = None
        if self.proc is None:
            self.env = base
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.functional.zygote"], cwd=REPO, env=self.env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.pending = b""
        return True

    def _read(self, timeout):
        """The next reply, or None after `timeout` seconds (the pipe read by hand: select cannot see a
        file object's buffer)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the test launcher (tests/functional/zygote.py) ended with {self.proc.wait()}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, cmd, script, args, nproc, env, timeout):
        """-> CompletedProcess of the command line, as subprocess.run(capture_output=True, text=True) gives.
        Once more if the rendezvous port was taken between the zygote's pick and rank 0's bind (torchrun's
        own store binds it, so a torchrun run has no such window)."""
        proc = self._run_once(cmd, script, args, nproc, env, timeout)
        if nproc > 1 and proc.returncode != 0 and port_taken(proc.stderr):
            proc = self._run_once(cmd, script, args, nproc, env, timeout)
        return proc

    def _run_once(self, cmd, script, args, nproc, env, timeout):
        with tempfile.TemporaryDirectory() as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            request = {"script": script, "args": args, "nproc": nproc, "env": env, "cwd": REPO,
                       "stdout": out, "stderr": err}
            for path in (out, err):
                open(path, "w").close()
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = self._read(60)["pid"]
            reply = self._read(timeout)
            if reply is None:
                os.killpg(pid, signal.SIGKILL)
                self._read(60)
            texts = []
            for path in (out, err):
                with open(path, errors="replace") as f:
                    texts.append(f.read())
        if reply is None:
            raise subprocess.TimeoutExpired(cmd, timeout, output=texts[0], stderr=texts[1])
        return subprocess.CompletedProcess(cmd, reply["code"], texts[0], texts[1])


_ZYGOTE = _Zygote()


def term_losses(stdout, name):
    """{iteration: value} of the loss term `name` (e.g. 'sop loss') from the iteration lines."""
    pattern = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| " + re.escape(name) + r": ([0-9.Ee+-]+|nan) \|")
    return {int(m.group(1)): float(m.group(2)) for m in pattern.finditer(stdout)}


def losses(stdout):
    """{iteration: lm loss} from the iteration lines."""
    return {int(m.group(1)): float(m.group(2)) for m in LOSS_RE.finditer(stdout)}


def run_metrics(args, nproc=1, script="pretrain_gpt.py", env=None):
    """Run the script with --log-metrics-jsonl into a temporary file.
    Returns (CompletedProcess, {"train": {iteration: record}, "validation": {iteration: record}})
    with the records as megatron/training/observability/metrics_jsonl.py writes them (full precision)."""
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    try:
        proc = run_cli(list(args) + ["--log-metrics-jsonl", path], nproc=nproc, script=script, env=env)
        metrics = {"train": {}, "validation": {}}
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                metrics.setdefault(record["type"], {})[record["iteration"]] = record
        return proc, metrics
    finally:
        os.remove(path)
