"""Checkpoint storage in one process, with a fake payload: a save interrupted at every fault
point loses nothing, interrupted commits are found, changed bytes and full disks are named."""
import os
import subprocess
import sys

import pytest
import torch

from megatron.core import debug
from megatron.core.checkpointing import CheckpointError, CheckpointReader, find_checkpoint
from megatron.core.checkpointing.storage import begin_save, commit, write_rank_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = 2
POINTS = ["ckpt.begin", "ckpt.rank_file.before", "ckpt.rank_file.write", "ckpt.rank_file.after",
          "ckpt.metadata.before", "ckpt.metadata.after", "ckpt.swap.aside", "ckpt.journal.after",
          "ckpt.rename.after", "ckpt.tracker.after", "ckpt.delete.during", "ckpt.commit.done"]
NEW_IN_PLACE = POINTS[POINTS.index("ckpt.rename.after"):]  # the new checkpoint is the one found
RESAVE_ONLY = ("ckpt.swap.aside", "ckpt.delete.during")  # there is an old one to move and delete


def save(root, iteration, value):
    """A 2-rank save from one process; each rank file holds `value`."""
    begin_save(root, iteration)
    for r in range(RANKS):
        write_rank_file(root, iteration, r, {"pieces": [], "value": torch.full((64,), float(value))})
    commit(root, iteration, {"consumed_samples": iteration}, RANKS)


def value_of(path):
    reader = CheckpointReader(path)
    values = {float(p["value"][0]) for p in reader.rank_payloads.values()}
    assert len(values) == 1
    return values.pop()


def interrupted(monkeypatch, point, iteration, action="raise"):
    monkeypatch.setenv(debug.FAULT_ENV, f"{point}:{iteration}:*:{action}")
    return pytest.raises(debug.InjectedFault if action == "raise" else CheckpointError)


def found(root):
    notes = []
    path = find_checkpoint(str(root), report=notes.append)
    return path, notes


def crash_then_find(root, monkeypatch, point, iteration):
    """Save iteration 2, then crash saving `iteration` at `point`: -> the notes of finding the
    checkpoint, which holds the new value once it is in place and the old one before."""
    save(root, 2, 1.0)
    with interrupted(monkeypatch, point, iteration):
        save(root, iteration, 2.0)
    path, notes = found(root)
    assert value_of(path) == (2.0 if point in NEW_IN_PLACE else 1.0)
    return notes


@pytest.mark.parametrize("point", POINTS)
def test_saving_the_trackers_iteration_again_never_loses_it(point, tmp_path, monkeypatch):
    notes = crash_then_find(tmp_path, monkeypatch, point, 2)
    assert bool(notes) == (point in ("ckpt.swap.aside", "ckpt.journal.after")), notes  # loaded from iter_*.old
    monkeypatch.delenv(debug.FAULT_ENV)
    save(tmp_path, 2, 3.0)  # the next save clears every leftover
    assert sorted(os.listdir(tmp_path)) == ["iter_0000002", "latest_checkpointed_iteration.txt"]
    assert value_of(found(tmp_path)[0]) == 3.0


@pytest.mark.parametrize("point", [p for p in POINTS if p not in RESAVE_ONLY])
def test_a_new_iteration_interrupted_anywhere(point, tmp_path, monkeypatch):
    notes = crash_then_find(tmp_path, monkeypatch, point, 4)
    # between the rename and the tracker, the complete iteration 4 is found and said so
    assert bool(notes) == (point == "ckpt.rename.after"), notes


def test_first_save_interrupted_before_the_tracker_exists(tmp_path, monkeypatch):
    with interrupted(monkeypatch, "ckpt.rename.after", 2):
        save(tmp_path, 2, 1.0)
    assert not os.path.exists(tmp_path / "latest_checkpointed_iteration.txt")
    path, notes = found(tmp_path)
    assert path.endswith("iter_0000002") and "no latest_checkpointed_iteration.txt" in notes[0]


def test_tracker_edited_by_hand_is_obeyed(tmp_path, monkeypatch):
    save(tmp_path, 2, 1.0)
    save(tmp_path, 4, 2.0)
    with interrupted(monkeypatch, "ckpt.rename.after", 6):
        save(tmp_path, 6, 3.0)
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    tracker.write_text("2")  # go back on purpose: newer than the interrupted commit's journal
    journal = os.stat(str(tracker) + ".tmp").st_mtime_ns
    os.utime(tracker, ns=(journal + 10**6, journal + 10**6))
    path, notes = found(tmp_path)
    assert path.endswith("iter_0000002") and not notes


def test_changed_bytes_of_the_same_size_are_named(tmp_path):
    save(tmp_path, 2, 1.0)
    f = tmp_path / "iter_0000002" / "rank_00001.pt"
    data = bytearray(f.read_bytes())
    i = data.find(torch.tensor(1.0).numpy().tobytes())  # the stored value's bytes
    data[i + 3] ^= 0x40
    f.write_bytes(bytes(data))
    path = find_checkpoint(str(tmp_path))  # sizes still match
    with pytest.raises(CheckpointError, match=r"rank_00001.pt: CRC-32 .* metadata says"):
        CheckpointReader(path)


@pytest.mark.parametrize("point,iteration", [(p, it) for it in (2, 4) for p in (
    "ckpt.begin", "ckpt.rank_file.write", "ckpt.metadata.before", "ckpt.swap.aside", "ckpt.journal.after")
    if (p, it) != ("ckpt.swap.aside", 4)])
def test_full_disk_keeps_the_previous_checkpoint(point, iteration, tmp_path, monkeypatch):
    save(tmp_path, 2, 1.0)
    with interrupted(monkeypatch, point, iteration, "enospc") as e:
        save(tmp_path, iteration, 2.0)
    msg = str(e.value)
    assert f"cannot save iteration {iteration}: No space left on device" in msg and "\n" not in msg
    assert "iteration 2 is still the latest" in msg
    assert sorted(os.listdir(tmp_path)) == ["iter_0000002", "latest_checkpointed_iteration.txt"]
    path, notes = found(tmp_path)
    assert path.endswith("iter_0000002") and value_of(path) == 1.0 and not notes


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_real_enospc_inside_torch_save_is_named_not_the_zip_writers_error(tmp_path):
    """rank_00001.pt a link to /dev/full (every write: ENOSPC): torch.save's zip writer reports it as
    "unexpected pos"; the save names the OS error, removes iter_X.tmp and keeps the previous checkpoint."""
    save(tmp_path, 2, 1.0)
    begin_save(tmp_path, 4)
    os.symlink("/dev/full", tmp_path / "iter_0000004.tmp" / "rank_00001.pt")
    write_rank_file(tmp_path, 4, 0, {"pieces": [], "value": torch.full((64,), 2.0)})
    with pytest.raises(CheckpointError) as e:
        write_rank_file(tmp_path, 4, 1, {"pieces": [], "value": torch.full((1 << 16,), 2.0)})
    msg = str(e.value)
    assert "cannot save iteration 4: No space left on device" in msg and "unexpected pos" not in msg
    assert "iter_0000004.tmp removed, the checkpoint of iteration 2 is still the latest" in msg
    assert sorted(os.listdir(tmp_path)) == ["iter_0000002", "latest_checkpointed_iteration.txt"]


def test_a_write_failing_inside_torch_save_is_named_not_the_zip_writers_error(tmp_path):
    """Writes past 20 kB fail for real in a child (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG, as a full disk
    gives ENOSPC) while torch.save is half-way through its zip, which then reports only "unexpected pos"."""
    save(tmp_path, 2, 1.0)
    code = f"""
import resource, signal, torch
from megatron.core.checkpointing import CheckpointError
from megatron.core.checkpointing.storage import begin_save, write_rank_file
begin_save({str(tmp_path)!r}, 4)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
try:
    write_rank_file({str(tmp_path)!r}, 4, 0, {{"pieces": [], "value": torch.zeros(1 << 16)}})
except CheckpointError as e:
    print(e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "cannot save iteration 4: File too large" in proc.stdout and "unexpected pos" not in proc.stdout
    assert "iter_0000004.tmp removed, the checkpoint of iteration 2 is still the latest" in proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["iter_0000002", "latest_checkpointed_iteration.txt"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_keeps_the_previous_checkpoint(tmp_path):
    save(tmp_path, 2, 1.0)
    os.chmod(tmp_path, 0o555)
    try:
        with pytest.raises(CheckpointError, match="cannot save iteration 4: Permission denied"):
            save(tmp_path, 4, 2.0)
    finally:
        os.chmod(tmp_path, 0o755)
    assert value_of(find_checkpoint(str(tmp_path))) == 1.0


def test_fault_spec(monkeypatch):
    debug.fault_point("ckpt.begin", 2, 0)  # unset: nothing
    monkeypatch.setenv(debug.FAULT_ENV, "ckpt.begin:4:1:raise")
    debug.fault_point("ckpt.begin", 2, 1)
    debug.fault_point("ckpt.begin", 4, 0)
    with pytest.raises(debug.InjectedFault):
        debug.fault_point("ckpt.begin", 4, 1)
    monkeypatch.setenv(debug.FAULT_ENV, "ckpt.begin:4:1:explode")
    with pytest.raises(ValueError, match="unknown action 'explode'"):
        debug.fault_point("ckpt.begin", 4, 1)


def test_count_traffic_counts_only_inside():
    debug.record_traffic("dp-grads", 5)
    with debug.count_traffic() as outer:
        debug.record_traffic("dp-grads", 10)
        with debug.count_traffic() as inner:
            debug.record_traffic("dp-params", 3)
    debug.record_traffic("dp-grads", 7)
    assert outer == {"dp-grads": 10, "dp-params": 3} and inner == {"dp-params": 3}
