"""Caching built dataset indices as .npy files, named by a hash of everything that affects them.

The first process on a machine to ask for an index takes a file lock, builds it and writes it
(each file atomically: written under a temporary name, then renamed); the others wait on the
lock and load it (memory-mapped). Nothing is shared between machines: each node's first
process builds the same arrays from the same inputs, so no shared filesystem is needed. The
hash covers the data's content (not its path), the split, sample count, sequence length and
seed, so the same data at another path reuses the cache and changed data never does.
"""
import contextlib
import hashlib
import json
import os
import tempfile

import numpy as np

from .indexed_dataset import DatasetError

INDEX_FORMAT = 1  # bump when an index-building algorithm changes


def default_cache_root():
    """$XDG_CACHE_HOME/megatron-3d, else ~/.cache/megatron-3d (never inside the installed package)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "megatron-3d")


def fingerprint(indexed):
    """What identifies an indexed dataset's content, cheaply: header values, file sizes and an md5
    of its .idx (the whole file up to 64 MiB, else its first and last 8 MiB). Computed once per object."""
    if getattr(indexed, "_fingerprint", None) is not None:
        return indexed._fingerprint
    idx = indexed.path_prefix + ".idx"
    size = os.path.getsize(idx)
    md5 = hashlib.md5()
    with open(idx, "rb") as fh:
        if size <= 64 << 20:
            md5.update(fh.read())
        else:
            md5.update(fh.read(8 << 20))
            fh.seek(size - (8 << 20))
            md5.update(fh.read())
    indexed._fingerprint = {"idx_bytes": size, "bin_bytes": os.path.getsize(indexed.bin_path),
                            "idx_md5": md5.hexdigest(), "dtype": indexed.dtype.name, "sequences": len(indexed)}
    return indexed._fingerprint


def description_hash(description):
    return hashlib.md5(json.dumps(description, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def file_lock(path):
    try:
        import fcntl
    except ImportError:  # no flock (Windows): concurrent builders write identical files atomically
        yield
        return
    with open(path, "a") as fh:
        with contextlib.suppress(OSError):  # a filesystem without locks: same fallback
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _save(path, array):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".npy")
    with os.fdopen(fd, "wb") as fh:
        np.save(fh, array, allow_pickle=False)
    os.replace(tmp, path)


def build_or_load(cache_dir, kind, description, names, build):
    """The arrays `names` for `description`, from cache_dir if there, else build() -> dict and save.

    cache_dir None: build in memory every time. Returns (dict name -> array, key, built: bool).
    """
    key = description_hash(description)
    if cache_dir is None:
        return build(), key, True
    paths = {n: os.path.join(cache_dir, f"{key}-{kind}-{n}.npy") for n in names}

    def load():
        if all(os.path.isfile(p) for p in paths.values()):
            try:
                return {n: np.load(p, mmap_mode="r", allow_pickle=False) for n, p in paths.items()}
            except (ValueError, OSError):  # a damaged cache file: rebuild it
                return None
        return None

    arrays = load()
    if arrays is not None:
        return arrays, key, False
    try:
        os.makedirs(cache_dir, exist_ok=True)
        with file_lock(os.path.join(cache_dir, f"{key}.lock")):
            arrays = load()  # another process may have built it while we waited
            if arrays is not None:
                return arrays, key, False
            arrays = build()
            for n, p in paths.items():
                _save(p, arrays[n])
            with open(os.path.join(cache_dir, f"{key}-{kind}-description.json"), "w") as fh:
                json.dump(description, fh, indent=1, sort_keys=True)
    except OSError as e:
        raise DatasetError(f"cannot write the index cache in {cache_dir} ({e.strerror or e}); "
                           "point --data-cache-path at a writable directory") from None
    return arrays, key, True
