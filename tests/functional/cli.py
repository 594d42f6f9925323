"""Running pretrain_gpt.py as a user would (python, or torchrun for several ranks) and reading its log."""
import json
import os
import re
import subprocess
import sys
import tempfile

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


def run_cli(args, nproc=1, script="pretrain_gpt.py", timeout=600, check=True, env=None, pinned=True):
    """Run the script; nproc > 1 goes through torchrun --standalone. env: extra variables. A trainer
    given flags gets PINNED before them (unless not `pinned`). Returns CompletedProcess."""
    if pinned and args and script in ("pretrain_gpt.py", "pretrain_bert.py"):
        args = PINNED + list(args)
    # one thread per rank (a test's env may say otherwise): ranks share the cores, and references compare alike
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script]
    else:
        cmd = [sys.executable, script]
    proc = subprocess.run(cmd + list(args), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd + list(args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}")
    return proc


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
    with the records as megatron/training/metrics_log.py writes them (full precision)."""
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
