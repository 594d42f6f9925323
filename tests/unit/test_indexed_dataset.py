"""The .bin/.idx format: our writer against a reader written here from the spec; damage is a clear error."""
import os
import struct

import numpy as np
import pytest

from megatron.core.datasets import DatasetError, IndexedDataset, IndexedDatasetBuilder, indexed_builder, optimal_dtype

CODES = {1: "u1", 2: "i1", 3: "i2", 4: "i4", 5: "i8", 6: "f8", 7: "f4", 8: "u2"}


def read_spec(prefix):
    """An independent reader of Megatron-LM's format, from the spec only (struct + plain file reads)."""
    with open(prefix + ".idx", "rb") as fh:
        assert fh.read(9) == b"MMIDIDX\x00\x00"
        version, code, n_seq, n_doc = struct.unpack("<QBQQ", fh.read(8 + 1 + 8 + 8))
        assert version == 1
        sizes = struct.unpack(f"<{n_seq}i", fh.read(4 * n_seq))
        pointers = struct.unpack(f"<{n_seq}q", fh.read(8 * n_seq))
        docs = struct.unpack(f"<{n_doc}q", fh.read(8 * n_doc))
        assert fh.read() == b""
    item = np.dtype(CODES[code]).itemsize
    with open(prefix + ".bin", "rb") as fh:
        data = fh.read()
    seqs = [np.frombuffer(data[p:p + s * item], dtype="<" + CODES[code]).tolist() for s, p in zip(sizes, pointers)]
    assert sum(sizes) * item == len(data)
    return CODES[code], seqs, list(docs)


def random_docs(seed, n, high):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, high, int(rng.integers(0, 50))).tolist() for _ in range(n)]


def write(prefix, docs, dtype):
    b = IndexedDatasetBuilder(str(prefix), dtype)
    for d in docs:
        b.add_document(d, [len(d)])
    b.finalize()
    return str(prefix)


@pytest.mark.parametrize("vocab", [300, 70_000])
def test_writer_output_parses_with_an_independent_reader(tmp_path, monkeypatch, vocab):
    monkeypatch.setattr(indexed_builder, "_SPILL", 7)  # exercise the spill-to-disk path
    docs = random_docs(vocab, 100, vocab)
    dtype = optimal_dtype(vocab)
    assert dtype == (np.uint16 if vocab < 65500 else np.int32)
    prefix = write(tmp_path / "d", docs, dtype)
    code, seqs, doc_idx = read_spec(prefix)
    assert code == ("u2" if vocab < 65500 else "i4")
    assert seqs == docs and doc_idx == list(range(len(docs) + 1))
    ds = IndexedDataset(prefix)
    assert [ds[i].tolist() for i in range(len(ds))] == docs
    for i in (i for i, d in enumerate(docs) if len(d) >= 3):
        assert ds.get(i, 1, 2).tolist() == docs[i][1:3]
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_multi_sequence_documents_and_merge(tmp_path):
    b = IndexedDatasetBuilder(str(tmp_path / "a"), np.uint16)
    b.add_document([1, 2, 3, 4, 5], [2, 3])
    b.add_document([], [])
    b.add_document([6], [1])
    b.finalize()
    write(tmp_path / "b", [[7, 8], [9]], np.uint16)
    m = IndexedDatasetBuilder(str(tmp_path / "m"), np.uint16)
    m.add_index(str(tmp_path / "a"))
    m.add_index(str(tmp_path / "b"))
    m.finalize()
    _, seqs, docs = read_spec(str(tmp_path / "m"))
    assert seqs == [[1, 2], [3, 4, 5], [6], [7, 8], [9]] and docs == [0, 2, 2, 3, 4, 5]
    write(tmp_path / "c", [[1]], np.int32)
    with pytest.raises(DatasetError, match="holds int32 tokens, not uint16"):
        IndexedDatasetBuilder(str(tmp_path / "x"), np.uint16).add_index(str(tmp_path / "c"))


def _damage(prefix, kind):
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    raw = bytearray(open(idx, "rb").read())
    if kind == "truncated idx":
        raw = raw[:-5]
    elif kind == "bad magic":
        raw[:4] = b"XXXX"
    elif kind == "bad version":
        raw[9:17] = struct.pack("<Q", 2)
    elif kind == "bad dtype":
        raw[17] = 42
    elif kind == "bad pointer":
        raw[34 + 4 * 20 + 8 * 3: 34 + 4 * 20 + 8 * 4] = struct.pack("<q", 12345)
    elif kind == "truncated bin":
        os.truncate(bin_, os.path.getsize(bin_) - 2)
    elif kind == "longer bin":
        with open(bin_, "ab") as fh:
            fh.write(b"\0\0")
    elif kind == "missing bin":
        os.remove(bin_)
    elif kind == "missing idx":
        os.remove(idx)
    with open(idx, "wb") if kind != "missing idx" else open(os.devnull, "wb") as fh:
        fh.write(raw)


DAMAGE = {"truncated idx": "is truncated", "bad magic": "bad header", "bad version": "index version 2",
          "bad dtype": "unknown dtype code 42", "bad pointer": "pointers do not match",
          "truncated bin": "the file is truncated", "longer bin": "longer than indexed",
          "missing bin": ".bin not found", "missing idx": ".idx not found"}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_files_are_one_line_errors(tmp_path, kind):
    prefix = write(tmp_path / "d", random_docs(1, 20, 300), np.uint16)
    _damage(prefix, kind)
    with pytest.raises(DatasetError) as info:
        IndexedDataset(prefix)
    assert DAMAGE[kind] in str(info.value) and "\n" not in str(info.value)


def test_empty_dataset_and_prefix_forms(tmp_path):
    prefix = write(tmp_path / "e", [], np.uint16)
    ds = IndexedDataset(prefix + ".bin")
    assert len(ds) == 0 and ds.num_documents == 0 and ds.num_tokens == 0
