"""Reading a loading rank's shard through the index (index.py): only the files and byte ranges
that hold its elements, each chunk's CRC-32 checked as it is read.

How a shard is found: every piece and the loading shard are placements of the same global
tensor (the sharding rule of pieces.py plus a flat range). `placement_index` gives, for each
element of a placement, its flat index in the global unpadded tensor (-1 for vocabulary
padding); `locate` inverts it by arithmetic. The reader finds the piece and position holding
each wanted global element by a binary search over the pieces' sorted flat ranges (PieceTable:
memory O(pieces), not O(elements) of the global tensor), then reads, per piece, the runs of
whole checksummed chunks that cover those positions.
"""
import functools
import json
import math
import os
import zlib

import torch

from ..tensor_parallel.initialization import take_shard
from .index_files import IndexFiles
from .pieces import CheckpointError, check_shape, param_rule
from .reading import CheckpointReader, load_rank_file, read_metadata


@functools.lru_cache(maxsize=1024)
def _dim_rows(padded, stride, tp_rank, tp_size):
    """int64 [padded / tp_size]: the padded global index along the split dim of each local
    index of one TP shard (take_shard's order). O(size of that dim), never of the tensor."""
    return take_shard(torch.arange(padded, dtype=torch.int64), 0, stride, tp_rank, tp_size)


@functools.lru_cache(maxsize=1024)
def _dim_owners(padded, stride, tp_size):
    """(tp_rank int64 [padded], local index int64 [padded]): where each padded global index
    along the split dim lives (the inverse of _dim_rows over every TP rank)."""
    rank, local = torch.empty(padded, dtype=torch.int64), torch.empty(padded, dtype=torch.int64)
    for r in range(tp_size):
        rows = _dim_rows(padded, stride, r, tp_size)
        rank[rows], local[rows] = r, torch.arange(len(rows))
    return rank, local


def placement_index(shape, dim, stride, padded, tp_rank, tp_size, lo=0, hi=None):
    """-> int64 [hi - lo]: the global unpadded flat index of each element of flat range [lo, hi)
    of the (tp_rank of tp_size) shard of a tensor of global `shape`, split on `dim` with `stride`
    blocks and `padded` rows along dim; -1 where the element is padding. Memory O(hi - lo)."""
    if dim is None:
        return torch.arange(lo, math.prod(shape) if hi is None else hi, dtype=torch.int64)
    rows = _dim_rows(padded, stride, tp_rank, tp_size)
    inner = math.prod(shape[dim + 1:])
    local = len(rows) * inner
    idx = torch.arange(lo, math.prod(shape[:dim]) * local if hi is None else hi, dtype=torch.int64)
    outer, row, col = idx // local, (idx // inner) % len(rows), idx % inner
    grow = rows[row]
    return torch.where(grow < shape[dim], (outer * shape[dim] + grow) * inner + col, -1)


def locate(shape, dim, stride, padded, tp_size, g):
    """(tp_rank, flat position in that rank's shard) of global unpadded flat indices g (int64,
    all >= 0) under one sharding rule: the inverse of placement_index, by arithmetic."""
    if dim is None:
        return torch.zeros_like(g), g
    rank, local = _dim_owners(padded, stride, tp_size)
    inner = math.prod(shape[dim + 1:])
    outer, row, col = g // (inner * shape[dim]), (g // inner) % shape[dim], g % inner
    return rank[row], (outer * (padded // tp_size) + local[row]) * inner + col


class PieceTable:
    """The pieces of one global tensor as sorted flat ranges of their TP shards: for each
    sharding rule (dim, stride, padded, tp_size) and TP rank, the pieces' [lo, hi) sorted by lo,
    loaded from the index only for the TP shards a lookup touches. Its size is O(pieces),
    whatever the tensor's element count (no per-element map)."""

    def __init__(self, index, key, state):
        self.index, self.key, self.state = index, key, state
        self.shape, self.rules = index.shape(key, state), index.rules(key, state)
        self.entries, self._tables = [], {}  # entries: the pieces loaded, numbered as find() returns

    def __len__(self):
        """Rows held: one per piece loaded."""
        return len(self.entries)

    def _table(self, rule, tp_rank):
        """int64 [pieces, 3]: (lo, hi, number) of the pieces of one TP shard, sorted by lo."""
        if (rule, tp_rank) not in self._tables:
            rows = []
            for e in self.index.records(self.key, self.state, rule, tp_rank):
                rows.append((e["lo"], e["hi"], len(self.entries)))
                self.entries.append(e)
            self._tables[(rule, tp_rank)] = torch.tensor(sorted(rows), dtype=torch.int64).reshape(-1, 3)
        return self._tables[(rule, tp_rank)]

    def find(self, g):
        """(piece number int64 [n], position in it int64 [n]) of global flat indices g (>= 0);
        piece -1 where no piece holds the element."""
        who, pos = torch.full_like(g, -1), torch.zeros_like(g)
        for rule, ranks in self.rules:
            todo = (who < 0).nonzero().reshape(-1)
            if len(todo) == 0:
                break
            rank, p = locate(self.shape, *rule[:3], rule[3], g[todo])
            for r in set(torch.unique(rank).tolist()) & set(ranks):
                table = self._table(rule, r)
                sel = (rank == r).nonzero().reshape(-1)
                row = torch.searchsorted(table[:, 0].contiguous(), p[sel], right=True) - 1
                hit = (row >= 0) & (p[sel] < table[row.clamp(min=0), 1])
                at, row = todo[sel[hit]], row[hit]
                who[at], pos[at] = table[row, 2], p[sel[hit]] - table[row, 0]
        return who, pos


class ParsedIndex:
    """Format 1: index.json parsed whole; the interface of index_files.IndexFiles (format 2), so
    the reader takes either. Shared by the readers given it (one process simulating many ranks)."""

    files_read = 1  # the one index.json (IndexFiles counts the files it opens)

    def __init__(self, index):
        self._rng, self.pieces = index["rng"], {}
        for e in index["pieces"]:
            self.pieces.setdefault((e["key"], e["state"]), []).append(e)

    def keys(self, state):
        return sorted(k for k, s in self.pieces if s == state)

    def has(self, key, state):
        return (key, state) in self.pieces

    def shape(self, key, state):
        return self.pieces[(key, state)][0]["shape"]

    def dtype(self, key, state):
        return self.pieces[(key, state)][0]["dtype"]

    def rules(self, key, state):
        out = {}
        for e in self.pieces[(key, state)]:
            out.setdefault((e["dim"], e["stride"], e["padded"], e["tp_size"]), set()).add(e["tp_rank"])
        return [(rule, sorted(ranks)) for rule, ranks in out.items()]

    def records(self, key, state, rule, tp_rank):
        return [e for e in self.pieces[(key, state)]
                if (e["dim"], e["stride"], e["padded"], e["tp_size"]) == rule and e["tp_rank"] == tp_rank]

    def rng(self, name):
        return (self._rng or {}).get(name)


def read_index(path, metadata):
    """The ParsedIndex of a format-1 checkpoint, index.json's size and CRC-32 checked against
    metadata.json; None for format 2 (per-tensor files, read by each reader as it needs them)."""
    info = metadata["index"]
    if info.get("format") == 2:
        return None
    index_path = os.path.join(path, info["name"])
    with open(index_path, "rb") as f:
        raw = f.read()
    if len(raw) != info["size"] or zlib.crc32(raw) != info["crc32"]:
        raise CheckpointError(f"{index_path}: size or CRC-32 differs from metadata.json (damaged)")
    return ParsedIndex(json.loads(raw))


class IndexedReader:
    """One loading rank's view of a checkpoint with an index; counts what it opens and reads
    (files_opened, bytes_read) so tests and the bench can hold it to its shard's size."""

    def __init__(self, path, metadata, index=None):
        """index: a format-1 ParsedIndex the caller has read (simulations of many ranks share one)."""
        info = metadata["index"]
        if info.get("format") == 2:  # per-tensor index files: read as needed
            self.index = IndexFiles(path, info)
        else:
            self.index = index if index is not None else read_index(path, metadata)
        self.path, self.metadata, self._tables = path, metadata, {}
        self.files_opened, self.bytes_read, self._open = set(), 0, {}

    @property
    def index_bytes(self):
        """Bytes of the index this rank read (format 1: all of index.json, on every rank)."""
        return self.index.bytes_read if isinstance(self.index, IndexFiles) else self.metadata["index"]["size"]

    def keys(self, state="param"):
        return self.index.keys(state)

    def has(self, key, state="param"):
        return self.index.has(key, state)

    def shape(self, key, state="param"):
        return self.index.shape(key, state)

    def complete(self, state):
        """Whether every tensor of the checkpoint has `state` (e.g. Adam's exp_avg)."""
        counts = self.metadata["index"].get("states")
        if counts is not None:
            return counts.get(state) == counts.get("param")
        return all(self.has(k, state) for k in self.keys("param"))

    def table(self, key, state):
        """The PieceTable of key/state (built on first use)."""
        if (key, state) not in self._tables:
            self._tables[(key, state)] = PieceTable(self.index, key, state)
        return self._tables[(key, state)]

    def close(self):
        for f in self._open.values():
            f.close()
        self._open = {}

    def _read(self, name, offset, nbytes):
        if name not in self._open:
            self._open[name] = open(os.path.join(self.path, name), "rb")
            self.files_opened.add(name)
        f = self._open[name]
        f.seek(offset)
        data = f.read(nbytes)
        self.bytes_read += len(data)
        if len(data) != nbytes:
            raise CheckpointError(f"{os.path.join(self.path, name)}: ends before byte {offset + nbytes} (truncated?)")
        return data

    def read_entry(self, e, positions=None):
        """The elements of entry `e` at `positions` (int64, sorted or not; all when None), read
        as whole checked chunks: -> 1-D tensor of e's dtype, len(positions) values."""
        dtype = getattr(torch, e["dtype"])
        size = torch.empty((), dtype=dtype).element_size()
        chunk = e["chunk"]
        chunks = range(len(e["crc32"])) if positions is None else torch.unique(positions * size // chunk).tolist()
        buf = bytearray(e["nbytes"])
        runs = []  # consecutive chunks read in one call
        for c in chunks:
            if runs and runs[-1][1] == c:
                runs[-1][1] = c + 1
            else:
                runs.append([c, c + 1])
        for a, b in runs:
            start, stop = a * chunk, min(b * chunk, e["nbytes"])
            data = self._read(e["file"], e["offset"] + start, stop - start)
            for c in range(a, b):
                part = data[(c - a) * chunk:(c - a + 1) * chunk]
                if zlib.crc32(part) != e["crc32"][c]:
                    raise CheckpointError(f"{os.path.join(self.path, e['file'])}: CRC-32 of bytes "
                                          f"{e['offset'] + c * chunk}.. differs from the index (damaged): restore "
                                          "the file, or load another checkpoint")
            buf[start:stop] = data
        values = torch.frombuffer(buf, dtype=dtype) if e["nbytes"] else torch.empty(0, dtype=dtype)
        return values if positions is None else values[positions]

    def gather(self, key, state, wanted):
        """Values of the global tensor key/state at flat indices `wanted` (int64 [n], -1 for
        padding: 0 there) -> 1-D [n], reading only the pieces and chunks that hold them."""
        table = self.table(key, state)
        real = wanted >= 0
        who = torch.full_like(wanted, -1)
        pos = torch.zeros_like(wanted)
        who[real], pos[real] = table.find(wanted[real])
        if bool((who[real] < 0).any()):
            missing = int((who[real] < 0).sum())
            raise CheckpointError(f"checkpoint is incomplete: {missing} wanted elements of {key!r} ({state}) "
                                  "are in no shard file")
        out = torch.zeros(len(wanted), dtype=getattr(torch, self.index.dtype(key, state)))
        for i in torch.unique(who[real]).tolist():
            sel = (who == i).nonzero().reshape(-1)
            out[sel] = self.read_entry(table.entries[i], pos[sel])
        return out

    def rng_state(self, name):
        """The RNG states saved in rank file `name` (nested dict), or None when not indexed."""
        if name not in self.metadata["files"]:
            return None
        entries = self.index.rng(name)
        if entries is None:  # not indexed: from the file itself
            return load_rank_file(self.path, name).get("rng")
        out = {}
        for path, e in entries.items():
            *parents, leaf = path.split("/")
            node = out
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = self.read_entry(e).clone()
        return out

    def shard(self, key, state, param, tp_rank, tp_size, ranges=None):
        """This rank's TP shard (param's local shape, vocabulary padding zero) of key/state; with
        `ranges` [(lo, hi)] of the flat shard only those elements are read (the rest are 0)."""
        shape, dim, stride, padded = param_rule(param, tp_rank, tp_size)
        check_shape(self.shape(key, state), shape, key)
        wanted = placement_index(shape, dim, stride, padded, tp_rank, tp_size)
        if ranges is not None:
            keep = torch.zeros(len(wanted), dtype=torch.bool)
            for lo, hi in ranges:
                keep[lo:hi] = True
            wanted = torch.where(keep, wanted, -1)
        return self.gather(key, state, wanted).view(param.shape)


def open_reader(path, metadata=None):
    """The reader a loading rank uses: IndexedReader (its byte ranges only) when the checkpoint
    has an index, else CheckpointReader (checkpoints from before the index: every file is read)."""
    metadata = metadata or read_metadata(path)
    return IndexedReader(path, metadata) if metadata.get("index") else CheckpointReader(path)
