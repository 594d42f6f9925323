"""--async-save through the CLI: the checkpoints it writes in the background resume bit-exactly
(two ranks, with --ckpt-fully-parallel-save spreading the replicated state over DP, and the resume
reading it with --ckpt-fully-parallel-load: each DP rank half, then all-gathered), and a kill
-9 during the background write loses nothing (test_crash_resume.py's pattern and reference)."""
import os

import pytest
import torch

from megatron.core.checkpointing import CheckpointReader

from .cli import run_cli
from .test_crash_resume import ARGS, check_resume, figures, kill_then_resume, reference  # noqa: F401 (fixture)


def global_state(path):
    """{(key, state): global tensor}: layout-free, so saves spread differently compare."""
    reader = CheckpointReader(path)
    return {(k, s): reader.global_tensor(k, s) for k in reader for s in ("param", "exp_avg", "exp_avg_sq")}


@pytest.mark.slow
def test_async_saves_resume_bit_exactly_on_two_ranks(tmp_path):
    args = ARGS  # on two ranks: DP 2
    ref_dir, d = str(tmp_path / "sync"), str(tmp_path / "async")
    ref = figures(run_cli(args + ["--save", ref_dir], nproc=2).stdout)
    flags = ["--async-save", "--ckpt-fully-parallel-save", "--save", d, "--load", d]
    first = run_cli(args + flags + ["--exit-interval", "4"], nproc=2).stdout
    assert "writing in the background (--async-save)" in first
    second = run_cli(args + flags + ["--ckpt-fully-parallel-load"], nproc=2).stdout
    got = {**figures(first), **figures(second)}
    assert sorted(got) == list(range(1, 7)) and got == ref
    a, b = global_state(os.path.join(ref_dir, "iter_0000006")), global_state(os.path.join(d, "iter_0000006"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    spread = CheckpointReader(os.path.join(d, "iter_0000006")).rank_payloads
    assert all(r["pieces"] for r in spread.values())  # both DP ranks wrote part of the state


@pytest.mark.slow
@pytest.mark.parametrize("point", ["ckpt.rank_file.write", "ckpt.rename.after"])
def test_kill_during_the_background_write_loses_nothing(reference, tmp_path, point):  # noqa: F811
    d = str(tmp_path / "ck")
    killed, after_kill, resumed = kill_then_resume(ARGS + ["--async-save", "--save", d, "--load", d], point, 4, d)
    assert killed.returncode != 0 and "writing in the background" in killed.stdout, killed.stderr[-2000:]
    assert after_kill is not None  # iteration 2 (or 4 once renamed in): never nothing
    first = 5 if point == "ckpt.rename.after" else 3
    assert check_resume(reference, resumed, d, first) == []
