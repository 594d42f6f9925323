"""Faults of a real filesystem and of one rank's files, through the CLI (issue 26):

- --save on a small tmpfs that fills up during the second save (sync on one process; --async-save and
  --ckpt-fully-parallel-save on two): one `error:` line, exit 2, the partial iter_0000002.tmp removed,
  the first checkpoint intact (every file's CRC-32) and still the one the tracker names;
- a write that fails on rank 1 only (injected ENOSPC): rank 1's reason, once, no "hung" line;
- a damaged shard that only rank 1 reads (TP2, EP2, ZeRO-3): rank 1's line reaches the user, once,
  and rank 0 does not call its peer hung.

tmpfs needs mount(2): root, as on this project's machines; elsewhere the tmpfs tests are skipped.
A kill -9 during an --async-save loses nothing: test_async_save.py.
"""
import os
import subprocess

import pytest

from megatron.core.checkpointing import iter_dir
from megatron.core.checkpointing.index_files import IndexFiles
from megatron.core.checkpointing.reading import check_complete, read_metadata

from .cli import run_cli
from .test_bad_inputs import assert_one_error_line

# 63 ids + eod, unpadded: every TP shard of the embedding holds real rows (a pure-padding shard is never read)
TINY = ["--mock-data", "--vocab-size", "63", "--make-vocab-size-divisible-by", "1", "--num-layers", "2",
        "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16", "--micro-batch-size", "2",
        "--eval-iters", "0", "--log-interval", "1"]
SAVES = ["--train-iters", "2", "--save-interval", "1"]
TRACKER = "latest_checkpointed_iteration.txt"


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of 800 KiB: one checkpoint of TINY (about 530 KiB) fits, a second does not."""
    root = tmp_path / "fs"
    root.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=800k", "tmpfs", str(root)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield str(root / "ckpt")
    subprocess.run(["umount", str(root)], check=True)


def assert_first_save_kept(proc, d, torchrun=False):
    assert_one_error_line(proc, f"--save {d}: cannot save iteration 2: No space left on device", torchrun, ran=True)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error:"))
    assert "iter_0000002.tmp removed, the checkpoint of iteration 1 is still the latest" in line, line
    assert "free space there or give another --save" in line
    assert "peer is stopped" not in proc.stderr
    assert sorted(os.listdir(d)) == ["iter_0000001", TRACKER]
    assert open(os.path.join(d, TRACKER)).read().strip() == "1"
    check_complete(iter_dir(d, 1), checksums=True)


@pytest.mark.parametrize("name,nproc,flags", [
    ("sync", 1, []),
    ("async-save", 2, ["--async-save"]),
    ("fully-parallel-save", 2, ["--ckpt-fully-parallel-save"]),
])
def test_disk_full_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(small_fs, name, nproc, flags):
    proc = run_cli(TINY + SAVES + flags + ["--save", small_fs], nproc=nproc, check=False, timeout=300)
    assert "saved checkpoint at iteration 1" in proc.stdout, proc.stderr[-3000:]
    assert_first_save_kept(proc, small_fs, torchrun=nproc > 1)


def test_a_write_failing_on_rank_1_only_is_its_line_once(tmp_path):
    d = str(tmp_path / "ckpt")
    proc = run_cli(TINY + SAVES + ["--tensor-model-parallel-size", "2", "--save", d], nproc=2, check=False,
                   timeout=300, env={"MEGATRON_DEBUG_FAULT": "ckpt.rank_file.write:2:1:enospc"})
    assert_one_error_line(proc, f"--save {d}: cannot save iteration 2: No space left on device (injected at "
                                "ckpt.rank_file.write)", torchrun=True, ran=True)
    assert "peer is stopped" not in proc.stderr
    assert sorted(os.listdir(d)) == ["iter_0000001", TRACKER]


def _damage_a_piece_only_rank_1_reads(path):
    """4 KiB of 0xab over the largest exp_avg piece in rank_00001.pt: at the same layout only rank 1 reads
    its own optimizer state (parameters may be read by every rank of a shard, exp_avg by its owner)."""
    index = IndexFiles(path, read_metadata(path)["index"])
    pieces = [e for key in index.keys("exp_avg") for rule, ranks in index.rules(key, "exp_avg") for r in ranks
              for e in index.records(key, "exp_avg", rule, r) if e["file"] == "rank_00001.pt"]
    e = max(pieces, key=lambda e: e["nbytes"])
    with open(os.path.join(path, "rank_00001.pt"), "r+b") as f:
        f.seek(e["offset"])
        f.write(b"\xab" * min(4096, e["nbytes"]))


MOE = ["--num-experts", "2", "--disable-bias-linear"]


@pytest.mark.parametrize("name,flags", [
    ("tp2", ["--tensor-model-parallel-size", "2"]),
    ("ep2", MOE + ["--expert-model-parallel-size", "2"]),
    ("zero3", ["--data-parallel-sharding-strategy", "optim_grads_params"]),
])
def test_a_damaged_shard_only_rank_1_reads_is_its_line_once(tmp_path, name, flags):
    d = str(tmp_path / "ckpt")
    run_cli(TINY + flags + ["--train-iters", "1", "--save", d], nproc=2, timeout=300)
    _damage_a_piece_only_rank_1_reads(iter_dir(d, 1))
    proc = run_cli(TINY + flags + ["--train-iters", "2", "--load", d], nproc=2, check=False, timeout=300)
    # rank 0 may have loaded its part and said so ("at iteration 1") before rank 1 stopped the run
    assert_one_error_line(proc, f"{iter_dir(d, 1)}/rank_00001.pt: CRC-32 of bytes", torchrun=True, ran=True)
    assert "peer is stopped" not in proc.stderr and "iteration        2/" not in proc.stdout
