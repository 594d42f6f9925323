"""A frozen rank (SIGSTOP) must not leave the others waiting silently: each live rank exits, within
the distributed timeout, with one line naming the wait, its rank and the peer (core/watchdog.py)."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from .cli import REPO

LIMIT = 10  # seconds, through MEGATRON_DEBUG_TIMEOUT_SECONDS
SLACK = 25  # a loaded machine's scheduling delays
ARGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--num-layers", "2",
        "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16", "--micro-batch-size", "1",
        "--global-batch-size", "4", "--train-iters", "50", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0"]


def _wait_for(path, pattern, deadline):
    while time.monotonic() < deadline:
        with open(path) as f:
            m = re.search(pattern, f.read())
        if m:
            return time.monotonic(), m
        time.sleep(0.2)
    return None, None


@pytest.mark.slow
@pytest.mark.parametrize("layout,pattern", [
    (["--pipeline-model-parallel-size", "2"],
     r"error: rank 0 waited 10 s in pipeline send/receive for rank 1 \((receive from|send to) 1.*"),
    ([], r"error: rank 0 waited 10 s in all-reduce \([a-z -]+\) over the group of ranks \[0, 1\].*"),
], ids=["pp2", "dp2"])
def test_a_stopped_rank_ends_the_others_with_one_line(tmp_path, layout, pattern):
    err = tmp_path / "stderr"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO, MEGATRON_DEBUG_TIMEOUT_SECONDS=str(LIMIT),
               MEGATRON_DEBUG_FAULT="train.iteration:3:1:stop")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "pretrain_gpt.py"]
    with open(err, "w") as f:
        proc = subprocess.Popen(cmd + ARGS + layout, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=f,
                                start_new_session=True)
    try:
        stopped, _ = _wait_for(err, r"debug: process \d+ stops itself", time.monotonic() + 300)
        assert stopped is not None, err.read_text()[-3000:]
        ended, m = _wait_for(err, pattern, stopped + LIMIT + SLACK)
        assert ended is not None, f"no watchdog line within {LIMIT + SLACK} s:\n{err.read_text()[-3000:]}"
        assert ended - stopped >= LIMIT - 1
        assert err.read_text().count("error: rank") == 1, err.read_text()[-3000:]
        assert f"{os.sep}megatron{os.sep}" not in err.read_text()  # no traceback of ours
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and what stayed in its process group
        proc.wait(timeout=60)
        # torchrun starts each rank in a session of its own: the stopped rank survives killpg and
        # would stay stopped, orphaned, after the test
        for pid in re.findall(r"debug: process (\d+) stops itself", err.read_text()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
