"""Checkpoint directories on a shared filesystem: saves that never lose the last good checkpoint.

    <dir>/latest_checkpointed_iteration.txt      the tracker: the last committed checkpoint's iteration
    <dir>/iter_0000010/metadata.json             written last: format, iteration, args, each file's
                                                 size and CRC-32 (zlib.crc32, the standard library)
    <dir>/iter_0000010/rank_00003.pt             rank 3's pieces (see pieces.py) and RNG states
    <dir>/iter_0000010/index/<tensor>.json       where each piece's bytes are (index.py, index_files.py):
                                                 a loading rank reads only its tensors' entries and
                                                 the byte ranges of its shard

A save passes these fault points (megatron/core/debug.py), in this order:

    ckpt.begin              rank 0: leftovers removed, iter_X.tmp/ about to be made
    ckpt.rank_file.before   every rank: about to write rank_R.pt into iter_X.tmp/
    ckpt.rank_file.write    its bytes written, not yet fsynced (a partial file)
    ckpt.rank_file.after    rank_R.pt and its checksum (rank_R.pt.crc32) durable
    ckpt.metadata.before    rank 0, after a barrier: metadata.json about to be written
    ckpt.metadata.after     iter_X.tmp/ complete
    ckpt.swap.aside         only when iter_X exists (saved again): renamed to iter_X.old
    ckpt.journal.after      the tracker-to-be written (latest_checkpointed_iteration.txt.tmp)
    ckpt.rename.after       iter_X.tmp renamed to iter_X; the tracker still names the previous one
    ckpt.tracker.after      the tracker names iter_X; iter_X.old not yet deleted
    ckpt.delete.during      iter_X.old partly deleted
    ckpt.commit.done        the save complete

No committed checkpoint is deleted before its replacement is in place and named, and a kill
at any point leaves one that reading.py finds (the tracker's; a complete checkpoint whose
commit was interrupted, saying so; or the one renamed aside). The next save removes the
leftovers: *.tmp directories and each iter_X.old whose iter_X exists. A save that cannot
write (disk full, read-only) raises CheckpointError after removing its partial iter_X.tmp/
(and moving an aside checkpoint back), so the previous checkpoint stays the latest.
"""
import errno
import json
import os
import shutil
import zipfile
import zlib

import torch

from ..debug import fault_point
from .index import file_entries, fold_sidecars, write_sidecar
from .pieces import CheckpointError

FORMAT = "megatron-3d-checkpoint/1"
TRACKER = "latest_checkpointed_iteration.txt"
JOURNAL = TRACKER + ".tmp"  # the tracker-to-be of a commit in progress
METADATA = "metadata.json"
ASIDE = ".old"  # a checkpoint being replaced by a new save of its iteration
CRC = ".crc32"  # a rank file's checksum, until rank 0 folds it into metadata.json


def iter_dir(root, iteration):
    return os.path.join(root, f"iter_{iteration:07d}")


def rank_file(rank):
    return f"rank_{rank:05d}.pt"


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Checksummed:
    """A write-only file that keeps the CRC-32 of what passes through it (for torch.save), and the
    OSError of a failed write: torch.save's zip writer reports it as "unexpected pos" instead."""

    def __init__(self, f):
        self.f, self.crc, self.error = f, 0, None

    def write(self, data):
        self.crc = zlib.crc32(data, self.crc)
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self):
        self.f.flush()


def _write_durable(path, write, fault=()):
    """write(file), fsync; -> the CRC-32 of the bytes written. fault: (point, iteration, rank)
    passed after the bytes are written, before they are durable."""
    with open(path, "wb") as f:
        out = _Checksummed(f)
        try:
            write(out)
        except RuntimeError:  # torch.save's writer, after our write raised (e.g. ENOSPC): the cause is ours
            if out.error is None:
                raise
            raise out.error from None
        if fault:
            fault_point(*fault)
        f.flush()
        os.fsync(f.fileno())
    return out.crc


def _read_text(path):
    with open(path) as f:
        return f.read().strip()


def abandon_save(root, iteration):
    """Remove the save's partial temporary directory (rank 0, once no rank writes into it any more)."""
    shutil.rmtree(iter_dir(root, iteration) + ".tmp", ignore_errors=True)


_FULL, _READ_ONLY = "free space there or give another --save", "give a writable --save"
_FIX = {errno.ENOSPC: _FULL, errno.EDQUOT: _FULL, errno.EROFS: _READ_ONLY, errno.EACCES: _READ_ONLY}


def _save_failed(root, iteration, error, remove_partial=True):
    """Remove the save's partial temporary directory (or leave that to the caller); -> the one-line
    CheckpointError."""
    if remove_partial:
        abandon_save(root, iteration)
    tracker = os.path.join(root, TRACKER)
    latest = _read_text(tracker) if os.path.isfile(tracker) else None
    kept = f"the checkpoint of iteration {latest} is still the latest" if latest else "no checkpoint was written"
    where = f" ({error.filename})" if getattr(error, "filename", None) else ""
    fix = f"; {_FIX[error.errno]}" if getattr(error, "errno", None) in _FIX else ""
    return CheckpointError(f"--save {root}: cannot save iteration {iteration}: {error.strerror or error}{where}; "
                           f"iter_{iteration:07d}.tmp removed, {kept}{fix}")


def _remove_leftovers(root):
    for name in os.listdir(root):
        path = os.path.join(root, name)
        stale_aside = name.endswith(ASIDE) and os.path.isdir(path[:-len(ASIDE)])
        if os.path.isdir(path) and (name.endswith(".tmp") or stale_aside):
            shutil.rmtree(path, ignore_errors=True)


def begin_save(root, iteration):
    """Rank 0, before the barrier that precedes the rank files: a fresh temporary directory."""
    tmp = iter_dir(root, iteration) + ".tmp"
    try:
        os.makedirs(root, exist_ok=True)
        _remove_leftovers(root)  # of saves that were killed
        fault_point("ckpt.begin", iteration, 0)
        os.makedirs(tmp)
    except OSError as e:
        raise _save_failed(root, iteration, e) from None
    return tmp


def write_rank_file(root, iteration, rank, payload, remove_partial=True):
    """Every rank: its pieces and RNG states, into the temporary directory, with their checksum.
    remove_partial False: a failure leaves iter_X.tmp/ to the caller (ranks write into it at once, and
    one removing it would fail the others' writes with another error: agreement.save_step removes it)."""
    path = os.path.join(iter_dir(root, iteration) + ".tmp", rank_file(rank))
    try:
        fault_point("ckpt.rank_file.before", iteration, rank)
        crc = _write_durable(path, lambda f: torch.save(payload, f), ("ckpt.rank_file.write", iteration, rank))
        _write_durable(path + CRC, lambda f: f.write(str(crc).encode()))
        write_sidecar(path, _entries(path, rank_file(rank), payload), _write_durable)
    except OSError as e:
        raise _save_failed(root, iteration, e, remove_partial) from None
    fault_point("ckpt.rank_file.after", iteration, rank, path=path)  # `corrupt`: damaged after its CRC


def _entries(path, name, payload):
    try:
        return file_entries(path, name, payload)
    except (zipfile.BadZipFile, KeyError, TypeError, RuntimeError):  # not a layout index.py knows
        return None


def commit(root, iteration, metadata, world_size):
    """Rank 0, after every rank file is on disk: metadata, then the new checkpoint swapped in
    and named by the tracker. Raises CheckpointError (nothing committed) when it cannot write."""
    tmp = iter_dir(root, iteration) + ".tmp"
    names = [rank_file(r) for r in range(world_size)]
    try:
        fault_point("ckpt.metadata.before", iteration, 0)
        metadata = dict(metadata, format=FORMAT, iteration=iteration,
                        files={n: os.path.getsize(os.path.join(tmp, n)) for n in names},
                        crc32={n: int(_read_text(os.path.join(tmp, n + CRC))) for n in names},
                        index=fold_sidecars(tmp, names, _write_durable))
        _write_durable(os.path.join(tmp, METADATA), lambda f: f.write(json.dumps(metadata, indent=1).encode()))
        for n in names:
            os.remove(os.path.join(tmp, n + CRC))
    except OSError as e:
        raise _save_failed(root, iteration, e) from None
    fault_point("ckpt.metadata.after", iteration, 0)
    _swap_in(root, iteration)


def _swap_in(root, iteration):
    tmp, final = iter_dir(root, iteration) + ".tmp", iter_dir(root, iteration)
    aside, journal = final + ASIDE, os.path.join(root, JOURNAL)
    moved = False
    try:
        if os.path.isdir(final):  # saved again: keep the old one until the new one is named
            shutil.rmtree(aside, ignore_errors=True)  # older than `final`
            os.rename(final, aside)
            moved = True
            fault_point("ckpt.swap.aside", iteration, 0)
        _write_durable(journal, lambda f: f.write(str(iteration).encode()))
        fault_point("ckpt.journal.after", iteration, 0)
        os.rename(tmp, final)
    except OSError as e:
        if moved:
            os.rename(aside, final)
        if os.path.exists(journal):
            os.remove(journal)
        raise _save_failed(root, iteration, e) from None
    _fsync_dir(root)
    fault_point("ckpt.rename.after", iteration, 0)
    try:
        os.replace(journal, os.path.join(root, TRACKER))
        _fsync_dir(root)
    except OSError as e:
        raise CheckpointError(f"--save {root}: iteration {iteration} is saved in {final} but {TRACKER} "
                              f"cannot be updated ({e.strerror}); resuming finds it") from None
    fault_point("ckpt.tracker.after", iteration, 0)
    if os.path.isdir(aside):
        _delete(aside, iteration)
    fault_point("ckpt.commit.done", iteration, 0)


def _delete(path, iteration):
    try:
        for i, name in enumerate(sorted(os.listdir(path), key=lambda n: (n != METADATA, n))):  # incomplete at once
            target = os.path.join(path, name)
            shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)  # index/: a directory
            if i == 0:
                fault_point("ckpt.delete.during", iteration, 0)
        os.rmdir(path)
    except OSError:
        pass  # the checkpoint is committed; the next save removes what is left


def save_global_checkpoint(root, pieces, args, iteration=0):
    """One process writes a whole-tensor checkpoint (converters): rank_00000.pt holds every
    piece; no optimizer or RNG state, so loading it trains from fresh optimizer state."""
    begin_save(root, iteration)
    write_rank_file(root, iteration, 0, {"pieces": pieces})
    commit(root, iteration, {"consumed_samples": 0, "args": args, "optimizer": None,
                             "layout": {"tp": 1, "pp": 1, "dp": 1, "vpp": None, "distributed_optimizer": False}}, 1)
