"""Finding and reading checkpoints written by storage.py: which directory to load, fully validated.

The tracker names the checkpoint to load, with two exceptions left by an interrupted save
(storage.py lists its steps):
  - no tracker, or a commit's journal newer than the tracker (killed between renaming the new
    checkpoint in and naming it): the newest COMPLETE iter_* newer than the tracker's is loaded;
  - the tracker's iter_X missing but iter_X.old complete (killed while saving X again): that one.
Each is reported in one line. A tracker edited by hand (to go back to an older checkpoint) is
newer than any journal and is obeyed. Complete means: metadata.json readable and of this
format, every file it lists present with its size and CRC-32. Without those exceptions only
sizes are checked here (cheap, any process); CheckpointReader checks the CRC-32 of each file.
"""
import json
import os
import re
import zlib

import torch

from .pieces import CheckpointError
from .storage import ASIDE, FORMAT, JOURNAL, METADATA, TRACKER, iter_dir

_ITER = re.compile(r"iter_(\d{7,})$")


def same_dir(a, b):
    """--load and --save name the same directory (the resume-or-start pattern)."""
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


def _crc32(path):
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def verify_file(path, name, metadata, checksum=True):
    """The size and (with `checksum`, for checkpoints that record it) CRC-32 of one listed file;
    CheckpointError naming it."""
    f = os.path.join(path, name)
    if not os.path.exists(f):
        raise CheckpointError(f"{f}: missing; the checkpoint is incomplete")
    size = metadata["files"][name]
    if os.path.getsize(f) != size:
        raise CheckpointError(f"{f}: {os.path.getsize(f)} bytes, metadata says {size} (truncated?)")
    expected = metadata.get("crc32", {}).get(name) if checksum else None
    if expected is not None and (crc := _crc32(f)) != expected:
        raise CheckpointError(f"{f}: CRC-32 {crc:08x}, metadata says {expected:08x}: "
                              "the file changed after the save (damaged)")


def check_complete(path, checksums=False):
    """-> the metadata of a complete checkpoint directory; CheckpointError with the reason otherwise."""
    meta_path = os.path.join(path, METADATA)
    if not os.path.exists(meta_path):
        raise CheckpointError(f"{meta_path} is missing (incomplete or deleted checkpoint)")
    try:
        meta = read_metadata(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{meta_path}: not valid JSON ({e}); the checkpoint is damaged") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: not a {FORMAT} checkpoint (format "
                              f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    for name in meta["files"]:
        verify_file(path, name, meta, checksums)
    return meta


def _complete(path):
    try:
        check_complete(path, checksums=True)
        return True
    except CheckpointError:
        return False


def _newest_complete(root, above):
    """The newest complete iter_* directory of an iteration above `above`, or None."""
    found = sorted(((int(m.group(1)), n) for n in os.listdir(root) if (m := _ITER.match(n))), reverse=True)
    for iteration, name in found:
        if iteration > above and _complete(os.path.join(root, name)):
            return os.path.join(root, name)
    return None


def _read_tracker(root):
    text = open(os.path.join(root, TRACKER)).read().strip()
    if not text.isdigit():
        raise CheckpointError(f"--load {root}: {TRACKER} holds {text[:40]!r}, not an iteration number")
    return int(text)


def find_checkpoint(root, allow_empty=False, report=None):
    """The directory of the checkpoint to load (see the module docstring), validated, or None when
    `allow_empty` and `root` holds no checkpoint at all. Raises CheckpointError with a one-line
    reason otherwise. report(line) receives the line saying why it is not the tracker's."""
    report = report or (lambda line: None)
    if not os.path.isdir(root):
        if allow_empty and not os.path.exists(root):
            return None
        raise CheckpointError(f"--load {root}: no such checkpoint directory")
    tracker, journal = os.path.join(root, TRACKER), os.path.join(root, JOURNAL)
    if not os.path.exists(tracker):
        newest = _newest_complete(root, -1)
        if newest:
            report(f"> {root}: no {TRACKER} (a save was interrupted?); loading the newest complete "
                   f"checkpoint, {newest}")
            return newest
        names = os.listdir(root)
        if any(_ITER.match(n) for n in names):
            raise CheckpointError(f"--load {root}: has iter_* directories but no {TRACKER} and no complete "
                                  "checkpoint; write the iteration to load into it")
        if "config.json" in names:
            raise CheckpointError(f"--load {root}: looks like a HuggingFace model, not a megatron-3d "
                                  "checkpoint; convert it with tools/checkpoint/convert.py --loader hf")
        if allow_empty:
            return None
        raise CheckpointError(f"--load {root}: no checkpoint ({TRACKER} is missing)")
    iteration = _read_tracker(root)
    if os.path.exists(journal) and os.stat(journal).st_mtime_ns >= os.stat(tracker).st_mtime_ns:
        newest = _newest_complete(root, iteration)
        if newest:
            report(f"> {root}: a save was interrupted after its checkpoint was complete; loading {newest} "
                   f"({TRACKER} still names iteration {iteration})")
            return newest
    path = iter_dir(root, iteration)
    if not os.path.exists(path) and os.path.isdir(path + ASIDE) and _complete(path + ASIDE):
        report(f"> {root}: saving iteration {iteration} again was interrupted; loading the previous "
               f"save of it, {path + ASIDE}")
        return path + ASIDE
    try:
        check_complete(path)
    except CheckpointError as e:
        if not os.path.exists(os.path.join(path, METADATA)):
            raise CheckpointError(f"--load {root}: {TRACKER} names iteration {iteration} but {e}") from None
        raise
    return path


def read_metadata(path):
    with open(os.path.join(path, METADATA)) as f:
        return json.load(f)


def load_rank_file(path, name):
    """One rank file, memory-mapped (only the pieces used are read from disk)."""
    f = os.path.join(path, name)
    try:
        return torch.load(f, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # any unpickling failure means a damaged file
        raise CheckpointError(f"{f}: cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


class CheckpointReader:
    """Every piece of a checkpoint, indexed by (key, state); global tensors on demand.
    Verifies each file's CRC-32 first (reads every byte once)."""

    def __init__(self, path):
        self.path = path
        self.metadata = read_metadata(path)
        self.rank_payloads = {}
        self.index = {}
        for name in sorted(self.metadata["files"]):
            verify_file(path, name, self.metadata)
            payload = load_rank_file(path, name)
            self.rank_payloads[name] = payload
            for p in payload.get("pieces", []):
                self.index.setdefault((p["key"], p["state"]), []).append(p)

    def keys(self, state="param"):
        return sorted(k for k, s in self.index if s == state)

    def __iter__(self):
        """The keys of the parameters (`for key in reader`)."""
        return iter(self.keys())

    def has(self, key, state="param"):
        return (key, state) in self.index

    def complete(self, state):
        """Whether every tensor of the checkpoint has `state` (e.g. Adam's exp_avg)."""
        return all(self.has(k, state) for k in self.keys())

    def shape(self, key, state="param"):
        return self.index[(key, state)][0]["shape"]

    def global_tensor(self, key, state="param"):
        from .pieces import assemble
        if (key, state) not in self.index:
            raise CheckpointError(f"checkpoint {self.path} has no tensor {key!r} ({state})")
        return assemble(self.index[(key, state)], f"{key!r} ({state})")

    def shard(self, key, state, param, tp_rank, tp_size, ranges=None):
        """This rank's TP shard of key/state (assembled from every piece; `ranges` unused)."""
        from .pieces import local_shard
        return local_shard(self.global_tensor(key, state), param, tp_rank, tp_size)

    def rng_state(self, name):
        """The RNG states rank file `name` holds, or None."""
        return self.rank_payloads.get(name, {}).get("rng")

    def close(self):
        """Nothing to release (the files are memory-mapped); IndexedReader closes its files."""
