"""The checkpoint index: where the bytes of every piece are, so a loading rank reads only its part.

A rank file (rank_RRRRR.pt) is a torch.save zip archive; torch stores each tensor's storage
uncompressed as its own record, numbered in pickling order. After writing the file, the writer
maps every piece's `data` (and every RNG tensor) to its record and notes (file, byte offset,
byte length, dtype, numel, CRC-32 of each chunk of `chunk` bytes). Each rank leaves that list beside its
file (rank_RRRRR.pt.index); rank 0 folds them at commit into one small file per tensor
(index_files.py: format 2, a loading rank reads only its tensors' entries) or, format 1 (the
first checkpoints with an index, still read), into one index.json:

    {"pieces": [{key, state, shape, dim, stride, padded, tp_rank, tp_size, lo, hi   (pieces.py)
                 file, offset, nbytes, dtype, numel, chunk, crc32: [one per chunk]}, ...],
     "rng": {file: {"torch": entry, "tracker/<name>": entry, ...}}}

The placement fields are the piece's own (the sharding rule plus a flat range: its global
offsets), so the files stay what they were: an old reader, torch.load and the tests read them
unchanged, and a checkpoint without index.json still loads (reading every file, reading.py).
Per-chunk checksums let a rank verify what it reads without reading whole files. A chunk is
64 KiB, or 1/MAX_CHUNKS of a large piece: the index then grows with the number of pieces, not
with the checkpoint's bytes (a 2.5 GB shard would otherwise list 40,000 checksums).
"""
import json
import os
import struct
import zipfile
import zlib

import torch

from .index_files import write_index_dir

CHUNK = 1 << 16  # the smallest chunk
MAX_CHUNKS = 64  # per piece
INDEX = "index.json"
SIDECAR = ".index"  # a rank file's entries, until rank 0 folds them into index.json
_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def chunk_size(nbytes):
    """Bytes per checksummed chunk of a piece of `nbytes`: CHUNK, or more (a multiple of it)
    so that a piece has at most MAX_CHUNKS."""
    return max(1, -(-nbytes // (CHUNK * MAX_CHUNKS))) * CHUNK


def chunk_crcs(data, chunk):
    """CRC-32 of each `chunk` bytes of a contiguous CPU tensor's storage."""
    raw = memoryview(data.reshape(-1).view(torch.uint8).numpy())
    return [zlib.crc32(raw[i:i + chunk]) for i in range(0, max(len(raw), 1), chunk)]


def _in_pickle_order(obj, out):
    """The tensors of a payload in the order pickle meets them (dicts and lists in order)."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _in_pickle_order(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _in_pickle_order(v, out)
    return out


def _records(path):
    """{storage key: (byte offset of its data, byte length)} of a torch.save zip file."""
    found = {}
    with open(path, "rb") as f, zipfile.ZipFile(f) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if len(parts) == 3 and parts[1] == "data" and info.compress_type == zipfile.ZIP_STORED:
                f.seek(info.header_offset + 26)
                name_len, extra_len = struct.unpack("<HH", f.read(4))
                found[parts[2]] = (info.header_offset + _LOCAL_HEADER + name_len + extra_len, info.file_size)
    return found


def _flat(tree, prefix=""):
    """{"a/b": tensor} of a nested dict whose leaves are tensors; None if any leaf is not."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            sub = _flat(v, f"{prefix}{k}/")
            if sub is None:
                return None
            out.update(sub)
        elif isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = v
        else:
            return None
    return out


def file_entries(path, name, payload):
    """The index entries of rank file `name` (at `path`, just written from `payload`), or None
    when its tensors cannot be mapped to records (then the checkpoint gets no index)."""
    records, keys, tensors = _records(path), {}, _in_pickle_order(payload, [])
    for t in tensors:  # torch numbers storages by first appearance
        keys.setdefault(t.untyped_storage()._cdata, str(len(keys)))

    def entry(t):
        offset, size = records.get(keys[t.untyped_storage()._cdata], (None, None))
        nbytes = t.numel() * t.element_size()
        if offset is None or size != nbytes or t.storage_offset() != 0 or not t.is_contiguous():
            return None
        return {"file": name, "offset": offset, "nbytes": nbytes, "dtype": dtype_name(t.dtype),
                "numel": t.numel(), "chunk": chunk_size(nbytes), "crc32": chunk_crcs(t, chunk_size(nbytes))}

    pieces = []
    for p in payload.get("pieces", []):
        e = entry(p["data"])
        if e is None:
            return None
        pieces.append(dict({k: v for k, v in p.items() if k != "data"}, **e))
    rng = _flat(payload["rng"]) if isinstance(payload.get("rng"), dict) else None
    rng_entries = {k: entry(t) for k, t in (rng or {}).items()}
    if rng is None or None in rng_entries.values():
        rng_entries = None  # loaded from the file itself (torch.load) when needed
    return {"pieces": pieces, "rng": rng_entries}


def write_sidecar(path, entries, write_durable):
    write_durable(path + SIDECAR, lambda f: f.write(json.dumps(entries).encode()))


def fold_sidecars(tmp, names, write_durable):
    """Rank 0 at commit: index.json from every rank file's sidecar -> its (size, CRC-32), or
    None (no index) when a sidecar says its file could not be mapped."""
    pieces, rng, complete = [], {}, True
    for n in names:
        with open(os.path.join(tmp, n + SIDECAR)) as f:
            entries = json.load(f)
        os.remove(os.path.join(tmp, n + SIDECAR))
        if entries is None:
            complete = False
            continue
        pieces += entries["pieces"]
        rng[n] = entries["rng"]
    if not complete:
        return None
    return write_index_dir(tmp, pieces, rng, write_durable)  # format 2: one small file per tensor


def write_index_json(tmp, pieces, rng, write_durable):
    """Format 1 (one index.json that every loading rank reads whole); kept for tests of old
    checkpoints. -> metadata.json's "index"."""
    target = os.path.join(tmp, INDEX)
    crc = write_durable(target, lambda f: f.write(json.dumps({"pieces": pieces, "rng": rng}).encode()))
    return {"name": INDEX, "size": os.path.getsize(target), "crc32": crc}
