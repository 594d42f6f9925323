"""Non-persistent local checkpoints (issue 41, item 3: --non-persistent-ckpt-type local) through the CLI, TP2
under `torchrun --max-restarts 1`: both ranks killed at the start of iteration 6 (first attempt); persistent
saves at 3 (--save-interval 3), local ones every iteration (kept: 4 and 5). The restart loads local iteration 5,
which is newer, and ends where an uninterrupted run does (every iteration's loss and grad norm, full
precision, and the final checkpoint, bitwise). With rank 1's local files damaged after their checksum
(MEGATRON_DEBUG_FAULT corrupt), the restart skips them in one line naming rank 1, loads the persistent
iteration 3 and ends in the same place. Bad flag values: one line each."""
import os

import pytest
import torch

from .cli import run_cli
from .test_async_save import global_state
from .test_bad_inputs import assert_one_error_line
from .test_restart import read_metrics, run_restarting
from .test_save_load_faults import TINY

BASE = TINY + ["--train-iters", "6", "--save-interval", "3", "--seed", "7", "--tensor-model-parallel-size", "2"]


def local_flags(root):
    return ["--non-persistent-save-interval", "1", "--non-persistent-ckpt-type", "local",
            "--non-persistent-local-ckpt-dir", root]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("local-ref")
    run_cli(BASE + ["--save", str(d / "ck"), "--log-metrics-jsonl", str(d / "m.jsonl")], nproc=2)
    return read_metrics(d / "m.jsonl"), global_state(str(d / "ck" / "iter_0000006"))


@pytest.mark.slow
@pytest.mark.parametrize("damaged", [False, True], ids=["intact", "rank1-damaged"])
def test_a_restart_loads_the_newest_local_checkpoint_intact_on_every_rank(reference, tmp_path, damaged):
    d, local, metrics = str(tmp_path / "ck"), str(tmp_path / "local"), str(tmp_path / "m.jsonl")
    fault = "train.iteration:6::kill:0" + (",local_ckpt.after:*:1:corrupt:0" if damaged else "")
    proc = run_restarting(BASE + local_flags(local) + ["--save", d, "--load", d, "--log-metrics-jsonl", metrics],
                          env={"MEGATRON_DEBUG_FAULT": fault}, nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(os.listdir(os.path.join(local, "rank_00001"))) == [
        "iter_0000004.json", "iter_0000004.pt", "iter_0000005.json", "iter_0000005.pt"]  # the last two (6: persistent)
    skipped = [x for x in proc.stdout.splitlines() if x.startswith("> local checkpoint") and "skipped" in x]
    restarted = next(x for x in proc.stdout.splitlines() if x.startswith("> restarted by torchrun"))
    if damaged:
        assert len(skipped) == 1, proc.stdout[-3000:]
        assert skipped[0].startswith("> local checkpoint iter_0000005 skipped: not intact on every rank (rank 1: ")
        assert "size or CRC-32 differs" in skipped[0]
        assert "loading the persistent checkpoint of iteration 3" in skipped[0]
        assert f"resuming from {d}/iter_0000003 (iteration 3)" in restarted, restarted
    else:
        assert not skipped and "> loaded local checkpoint iter_0000005" in proc.stdout, proc.stdout[-3000:]
        assert "rank_00000/iter_0000005.pt (iteration 5): the newest local checkpoint" in restarted, restarted
    ref_metrics, ref_state = reference
    assert read_metrics(metrics) == ref_metrics
    got = global_state(os.path.join(d, "iter_0000006"))
    assert got.keys() == ref_state.keys() and all(torch.equal(got[k], ref_state[k]) for k in got)


@pytest.mark.parametrize("flags,line", [
    (["--non-persistent-ckpt-type", "local"], "--non-persistent-ckpt-type local needs --non-persistent-local-ckpt-dir"),
    (["--non-persistent-save-interval", "2"], "--non-persistent-save-interval needs --non-persistent-ckpt-type local"),
    (["--non-persistent-ckpt-type", "global"], "--non-persistent-ckpt-type global is not built here"),
    (["--non-persistent-ckpt-type", "local", "--non-persistent-local-ckpt-dir", "x", "--non-persistent-save-interval",
      "0"], "--non-persistent-save-interval must be at least 1"),
])
def test_bad_local_checkpoint_flags_are_one_line(flags, line):
    assert_one_error_line(run_cli(TINY + ["--train-iters", "1"] + flags, check=False, timeout=120), line)
