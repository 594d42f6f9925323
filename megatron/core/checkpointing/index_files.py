"""The index as one small file per tensor (format 2), so a loading rank reads only the index
entries of the tensors and TP shards it needs, not the whole index of every rank's pieces.

    iter_X/index/<key>.json        one global tensor:
        HEAD: 21 bytes, "<header length: 12 digits><CRC-32 of the header: 8 hex>\\n"
        header JSON: {"shape", "dtype", "states": {state: [[dim, stride, padded, tp_size,
                      [tp ranks], [record bounds]], ...]}}  (one item per sharding rule)
        then one record per (state, rule, TP rank), record i at bytes [bounds[i], bounds[i + 1])
        from the header's end: its CRC-32 (8 hex digits), then a JSON list of the pieces of that
        TP shard, [file, offset, nbytes, lo, hi, chunk, [crc32 per chunk]] each
    iter_X/index/rng/<rank file>.json   the RNG entries of one rank file (index.py's entries)

A loading rank reads, per tensor it holds, the 21-byte head, the header, and the records of the
TP ranks its shard overlaps (in its own layout: one per state). metadata.json's "index" says
{"format": 2, "name": "index", "states": {state: number of tensors with it}} (the counts tell
the loader whether optimizer state is complete without opening every tensor's file). Index
format 1 (one index.json, index.py) is still read (index_reader.ParsedIndex).
"""
import json
import os
import urllib.parse
import zlib

from .pieces import CheckpointError

DIR = "index"
_HEAD = 21
_PLACEMENT = ("dim", "stride", "padded", "tp_size")


def _name(key):
    return urllib.parse.quote(key, safe="") + ".json"


def write_index_dir(tmp, pieces, rng, write_durable):
    """Rank 0 at commit: the per-tensor files of `pieces` (index.py entries, every rank's) and
    the RNG entries `rng` ({rank file: entries}). -> metadata.json's "index"."""
    root = os.path.join(tmp, DIR)
    os.makedirs(os.path.join(root, "rng"))
    tensors, states = {}, {}
    for e in pieces:
        rule = tuple(e[k] for k in _PLACEMENT)
        tensors.setdefault(e["key"], {}).setdefault(e["state"], {}).setdefault(rule, {}) \
            .setdefault(e["tp_rank"], []).append(e)
    for key, by_state in tensors.items():
        any_piece = next(iter(next(iter(by_state.values())).values()))
        first = next(iter(any_piece.values()))[0]
        header, body, offset = {"shape": first["shape"], "dtype": first["dtype"], "states": {}}, [], 0
        for state, rules in by_state.items():
            states[state] = states.get(state, 0) + 1
            for rule, ranks in rules.items():
                order, bounds = sorted(ranks), [offset]
                for r in order:
                    rows = sorted([e["file"], e["offset"], e["nbytes"], e["lo"], e["hi"], e["chunk"], e["crc32"]]
                                  for e in ranks[r])
                    raw = json.dumps(rows, separators=(",", ":")).encode()
                    body.append(f"{zlib.crc32(raw):08x}".encode() + raw)
                    offset += 8 + len(raw)
                    bounds.append(offset)
                header["states"].setdefault(state, []).append([*rule, order, bounds])
        head = json.dumps(header, separators=(",", ":")).encode()  # record offsets: from its end
        blob = f"{len(head):012d}{zlib.crc32(head):08x}\n".encode() + head + b"".join(body)
        write_durable(os.path.join(root, _name(key)), lambda f, b=blob: f.write(b))
    for name, entries in rng.items():
        raw = json.dumps(entries).encode()
        write_durable(os.path.join(root, "rng", name + ".json"), lambda f, b=raw: f.write(b))
    return {"format": 2, "name": DIR, "states": states}


class IndexFiles:
    """Format-2 index of one checkpoint, read lazily; counts bytes and files it reads
    (bytes_read, files_read) so the bench can set them against a rank's shard."""

    def __init__(self, path, info):
        self.root, self.info = os.path.join(path, info["name"]), info
        self.bytes_read, self.files_read, self._headers = 0, 0, {}

    def _read(self, name, offset, nbytes, opened=True):
        """Bytes [offset, offset + nbytes) of index file `name` (all: nbytes None), or None when
        it does not exist; `opened`: count it as a file read (a file's first read)."""
        path = os.path.join(self.root, name)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                raw = f.read(nbytes) if nbytes is not None else f.read()
        except FileNotFoundError:
            return None
        self.files_read += opened
        self.bytes_read += len(raw)
        return raw

    def header(self, key):
        """{"shape", "dtype", "states"} of tensor `key` (see the module docstring), or None."""
        if key not in self._headers:
            raw = self._read(_name(key), 0, _HEAD)
            if raw is None:
                self._headers[key] = None
                return None
            try:
                size, crc = int(raw[:12]), int(raw[12:20], 16)
            except ValueError:  # not the head this module writes: overwritten or truncated
                raise self._damaged(_name(key), "its head is not an index file's") from None
            head = self._read(_name(key), _HEAD, size, opened=False)
            if len(head) != size or zlib.crc32(head) != crc:
                raise self._damaged(_name(key), "header damaged (CRC-32 or size)")
            self._headers[key] = dict(json.loads(head), base=_HEAD + size)
        return self._headers[key]

    def keys(self, state):
        names = [n for n in os.listdir(self.root) if n.endswith(".json")]
        keys = sorted(urllib.parse.unquote(n[:-5]) for n in names)
        return keys if self.info["states"].get(state) == len(keys) else [k for k in keys if self.has(k, state)]

    def has(self, key, state):
        h = self.header(key)
        return h is not None and state in h["states"]

    def shape(self, key, state):
        return self.header(key)["shape"]

    def dtype(self, key, state):
        return self.header(key)["dtype"]

    def rules(self, key, state):
        """[(dim, stride, padded, tp_size), [tp ranks]] of key/state's pieces."""
        return [(tuple(item[:4]), item[4]) for item in self.header(key)["states"][state]]

    def records(self, key, state, rule, tp_rank):
        """The index entries (index.py's form) of key/state's pieces of one TP shard."""
        h = self.header(key)
        item = next(i for i in h["states"][state] if tuple(i[:4]) == rule)
        i = item[4].index(tp_rank)
        offset, length = item[5][i], item[5][i + 1] - item[5][i]
        raw = self._read(_name(key), h["base"] + offset, length, opened=False)
        if len(raw) != length or f"{zlib.crc32(raw[8:]):08x}".encode() != raw[:8]:
            raise self._damaged(_name(key), f"record at {offset} damaged (CRC-32)")
        placement = dict(zip(_PLACEMENT, rule), key=key, state=state, shape=h["shape"], tp_rank=tp_rank,
                         dtype=h["dtype"])
        return [dict(placement, file=f, offset=o, nbytes=n, lo=lo, hi=hi, chunk=c, crc32=crcs,
                     numel=hi - lo) for f, o, n, lo, hi, c, crcs in json.loads(raw[8:])]

    def rng(self, name):
        raw = self._read(os.path.join("rng", name + ".json"), 0, None)
        try:
            return None if raw is None else json.loads(raw)
        except ValueError:  # no checksum of its own: JSON that does not parse is the damage seen
            raise self._damaged(os.path.join("rng", name + ".json"), "not JSON") from None

    def _damaged(self, name, what):
        return CheckpointError(f"{os.path.join(self.root, name)}: {what}; the checkpoint's index is damaged: restore "
                               "the directory from a copy or load another checkpoint")
