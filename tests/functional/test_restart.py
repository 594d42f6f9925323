"""Restarts resume exactly (issue 41, item 1): under `torchrun --max-restarts 1` with --save and --load the
same directory, a rank SIGKILLed (MEGATRON_DEBUG_FAULT, first attempt only) makes torchrun restart the
group, which loads the newest complete checkpoint and goes on: every iteration's loss and grad norm (full
precision, --log-metrics-jsonl: the last record of each iteration) and the final weights and optimizer
state equal the uninterrupted run's bitwise (the same computations in the same order: the same layout).
The restarted run's start-up line names the checkpoint and why.

Layouts TP2 x DP2 and PP2 x DP2 with ZeRO-3 (--data-parallel-sharding-strategy optim_grads_params); kills
of rank 0 and rank 1 at iterations 2 to 5, at the start of an iteration, during a sync save and during an
--async-save's background write. The default run keeps one case per layout; the rest: tests/full_matrix.py.
"""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from .cli import PINNED, REPO, run_cli, run_environment
from .test_async_save import global_state
from .test_bad_inputs import assert_one_error_line
from .test_save_load_faults import TINY

LENGTH = ["--train-iters", "6", "--save-interval", "2", "--seed", "7"]
LAYOUTS = {
    "tp2-dp2": ["--tensor-model-parallel-size", "2"],
    "pp2-dp2-zero3": ["--pipeline-model-parallel-size", "2", "--data-parallel-sharding-strategy", "optim_grads_params"],
}
# (layout, fault point, iteration, rank, flags, the iteration the restart resumes from)
CASES = {
    "tp2-dp2-rank1-iteration3": ("tp2-dp2", "train.iteration", 3, 1, [], 2),
    "tp2-dp2-rank0-sync-save4": ("tp2-dp2", "ckpt.rank_file.write", 4, 0, [], 2),
    "tp2-dp2-rank1-async-save4": ("tp2-dp2", "ckpt.rank_file.write", 4, 1, ["--async-save"], 2),
    "zero3-rank1-async-save2": ("pp2-dp2-zero3", "ckpt.rank_file.write", 2, 1, ["--async-save"], None),
    "zero3-rank0-iteration5": ("pp2-dp2-zero3", "train.iteration", 5, 0, [], 4),
    "zero3-rank0-sync-commit4": ("pp2-dp2-zero3", "ckpt.metadata.before", 4, 0, [], 2),
}


def read_metrics(path):
    """{iteration: (losses, grad norm)}, the last record of each (a restarted run appends its own)."""
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["type"] == "train":
                out[r["iteration"]] = (r["losses"], r["grad_norm"])
    return out


def run_restarting(args, env, nproc=4):
    """torchrun --max-restarts 1 (the zygote launcher cannot restart): -> CompletedProcess."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=1", "pretrain_gpt.py", *PINNED, *args]
    return subprocess.run(cmd, cwd=REPO, env=run_environment(env), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """{layout: (metrics, final global state)} of an uninterrupted run, made when first asked for."""
    made = {}

    def get(layout):
        if layout not in made:
            d = tmp_path_factory.mktemp(f"ref-{layout}")
            run_cli(TINY + LENGTH + LAYOUTS[layout] + ["--save", str(d / "ck"), "--log-metrics-jsonl",
                                                      str(d / "m.jsonl")], nproc=4, timeout=600)
            made[layout] = read_metrics(d / "m.jsonl"), global_state(str(d / "ck" / "iter_0000006"))
        return made[layout]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_killed_rank_restarts_the_group_which_resumes_bitwise(references, tmp_path, case):
    layout, point, iteration, rank, flags, resumed_from = CASES[case]
    ref_metrics, ref_state = references(layout)
    d, metrics = str(tmp_path / "ck"), str(tmp_path / "m.jsonl")
    proc = run_restarting(TINY + LENGTH + LAYOUTS[layout] + flags + ["--save", d, "--load", d,
                                                                     "--log-metrics-jsonl", metrics],
                          env={"MEGATRON_DEBUG_FAULT": f"{point}:{iteration}:{rank}:kill:0"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    # torchrun saw a worker fail: the killed one (exitcode -9) or, if its poll came first, a peer whose gloo
    # read failed (the fault fires in the first launch only, so the restart below is the kill's)
    assert re.search(r"failed \(exitcode: -?\d+\) local_rank: \d", proc.stderr), proc.stderr[-4000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith("> restarted by torchrun")]
    assert len(lines) == 1, proc.stdout[-4000:]
    if resumed_from is None:
        assert "no complete checkpoint in --load" in lines[0], lines[0]
    else:
        assert f"resuming from {d}/iter_{resumed_from:07d} (iteration {resumed_from}): " in lines[0], lines[0]
    assert read_metrics(metrics) == ref_metrics  # every iteration, full precision: the same ops in the same order
    got = global_state(os.path.join(d, "iter_0000006"))
    assert got.keys() == ref_state.keys() and all(torch.equal(got[k], ref_state[k]) for k in got)


@pytest.mark.parametrize("flags", [["--inprocess-restart"], ["--inprocess-soft-timeout", "30"]])
def test_in_process_restart_is_refused_in_one_line(flags):
    proc = run_cli(TINY + ["--train-iters", "1"] + flags, check=False, timeout=120)
    assert_one_error_line(proc, f"not built here: in-process restart (NVRx) ({flags[0]}; not built: restart with "
                                "torchrun --max-restarts, docs/fault_tolerance.md)")
