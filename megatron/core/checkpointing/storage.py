"""Checkpoint directories on a shared filesystem: atomic writes and validated reads.

    <dir>/latest_checkpointed_iteration.txt      the last COMPLETE checkpoint's iteration
    <dir>/iter_0000010/metadata.json             written last: format, iteration, args, file sizes
    <dir>/iter_0000010/rank_00003.pt             rank 3's pieces (see pieces.py) and RNG states

Atomicity: every rank writes into iter_XXXXXXX.tmp/; after a barrier rank 0 writes
metadata.json, renames the directory into place and only then replaces the tracker (via
a temporary file and os.replace). A process killed at any point leaves the tracker
naming the previous complete checkpoint; a stale .tmp directory is removed by the next save.
"""
import json
import os
import shutil

import torch

from .pieces import CheckpointError

FORMAT = "megatron-3d-checkpoint/1"
TRACKER = "latest_checkpointed_iteration.txt"
METADATA = "metadata.json"
FAULT_ENV = "MEGATRON_CKPT_TEST_FAULT"  # tests only: "<iteration>:<rank>" -> die after the rank file


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


def _write_durable(path, write):
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def begin_save(root, iteration):
    """Rank 0, before the barrier that precedes the rank files: a fresh temporary directory."""
    tmp = iter_dir(root, iteration) + ".tmp"
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):  # leftovers of a save that was killed
        if name.endswith(".tmp"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def write_rank_file(root, iteration, rank, payload):
    """Every rank: its pieces and RNG states, into the temporary directory."""
    path = os.path.join(iter_dir(root, iteration) + ".tmp", rank_file(rank))
    _write_durable(path, lambda f: torch.save(payload, f))
    fault = os.environ.get(FAULT_ENV)
    if fault and fault == f"{iteration}:{rank}":
        os._exit(43)  # simulate a kill between shard writes (tests)


def commit(root, iteration, metadata, world_size):
    """Rank 0, after every rank file is on disk: metadata, rename into place, tracker."""
    tmp, final = iter_dir(root, iteration) + ".tmp", iter_dir(root, iteration)
    metadata = dict(metadata, format=FORMAT, iteration=iteration,
                    files={rank_file(r): os.path.getsize(os.path.join(tmp, rank_file(r)))
                           for r in range(world_size)})
    _write_durable(os.path.join(tmp, METADATA), lambda f: f.write(json.dumps(metadata, indent=1).encode()))
    if os.path.exists(final):  # saving the same iteration again
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    tracker_tmp = os.path.join(root, TRACKER + ".tmp")
    _write_durable(tracker_tmp, lambda f: f.write(str(iteration).encode()))
    os.replace(tracker_tmp, os.path.join(root, TRACKER))
    _fsync_dir(root)


def same_dir(a, b):
    """--load and --save name the same directory (the resume-or-start pattern)."""
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


def find_checkpoint(root, allow_empty=False):
    """The directory of the checkpoint the tracker names, fully validated, or None when
    `allow_empty` and `root` holds no checkpoint at all. Raises CheckpointError with a
    one-line reason otherwise. Reads only metadata and file sizes (cheap, any process)."""
    if not os.path.isdir(root):
        if allow_empty and not os.path.exists(root):
            return None
        raise CheckpointError(f"--load {root}: no such checkpoint directory")
    tracker = os.path.join(root, TRACKER)
    if not os.path.exists(tracker):
        names = os.listdir(root)
        if any(n.startswith("iter_") and not n.endswith(".tmp") for n in names):
            raise CheckpointError(f"--load {root}: has iter_* directories but no {TRACKER}; "
                                  "write the iteration to load into it")
        if "config.json" in names:
            raise CheckpointError(f"--load {root}: looks like a HuggingFace model, not a megatron-3d "
                                  "checkpoint; convert it with tools/checkpoint/convert.py --loader hf")
        if allow_empty:
            return None
        raise CheckpointError(f"--load {root}: no checkpoint ({TRACKER} is missing)")
    text = open(tracker).read().strip()
    if not text.isdigit():
        raise CheckpointError(f"--load {root}: {TRACKER} holds {text[:40]!r}, not an iteration number")
    path = iter_dir(root, int(text))
    meta_path = os.path.join(path, METADATA)
    if not os.path.exists(meta_path):
        raise CheckpointError(f"--load {root}: {TRACKER} names iteration {int(text)} but "
                              f"{meta_path} is missing (incomplete or deleted checkpoint)")
    try:
        meta = json.load(open(meta_path))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{meta_path}: not valid JSON ({e}); the checkpoint is damaged") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: not a {FORMAT} checkpoint (format "
                              f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    for name, size in meta["files"].items():
        f = os.path.join(path, name)
        if not os.path.exists(f):
            raise CheckpointError(f"{f}: missing; the checkpoint is incomplete")
        if os.path.getsize(f) != size:
            raise CheckpointError(f"{f}: {os.path.getsize(f)} bytes, metadata says {size} (truncated?)")
    return path


def read_metadata(path):
    return json.load(open(os.path.join(path, METADATA)))


def load_rank_file(path, name):
    """One rank file, memory-mapped (only the pieces used are read from disk)."""
    f = os.path.join(path, name)
    try:
        return torch.load(f, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a damaged file
        raise CheckpointError(f"{f}: cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


class CheckpointReader:
    """Every piece of a checkpoint, indexed by (key, state); global tensors on demand."""

    def __init__(self, path):
        self.path = path
        self.metadata = read_metadata(path)
        self.rank_payloads = {}
        self.index = {}
        for name in sorted(self.metadata["files"]):
            payload = load_rank_file(path, name)
            self.rank_payloads[name] = payload
            for p in payload.get("pieces", []):
                self.index.setdefault((p["key"], p["state"]), []).append(p)

    def keys(self, state="param"):
        return sorted(k for k, s in self.index if s == state)

    def has(self, key, state="param"):
        return (key, state) in self.index

    def shape(self, key, state="param"):
        return self.index[(key, state)][0]["shape"]

    def global_tensor(self, key, state="param"):
        from .pieces import assemble
        if (key, state) not in self.index:
            raise CheckpointError(f"checkpoint {self.path} has no tensor {key!r} ({state})")
        return assemble(self.index[(key, state)], f"{key!r} ({state})")


def save_global_checkpoint(root, pieces, args, iteration=0):
    """One process writes a whole-tensor checkpoint (converters): rank_00000.pt holds every
    piece; no optimizer or RNG state, so loading it trains from fresh optimizer state."""
    begin_save(root, iteration)
    write_rank_file(root, iteration, 0, {"pieces": pieces})
    commit(root, iteration, {"consumed_samples": 0, "args": args, "optimizer": None,
                             "layout": {"tp": 1, "pp": 1, "dp": 1, "vpp": None, "distributed_optimizer": False}}, 1)
