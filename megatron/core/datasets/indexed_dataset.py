"""Megatron-LM's indexed dataset format (.bin tokens + .idx index), read by mmap and written streaming.

.idx, little-endian:
    b"MMIDIDX\\x00\\x00"   9-byte magic
    u64 version = 1
    u8  dtype code          (DTYPES below; uint16 when the vocabulary fits, else int32)
    u64 S                   sequence count
    u64 D                   document-index count (documents + 1)
    int32[S]  sizes         tokens per sequence
    int64[S]  pointers      byte offset of each sequence in .bin
    int64[D]  document_indices  0, then the sequence count at the end of each document
.bin: the tokens of all sequences back to back, in the dtype.

A file that does not match this exactly (magic, version, dtype, file sizes, pointers, document
indices) raises DatasetError with one line naming the file and the problem.
"""
import os
import struct

import numpy as np

from ..errors import DatasetError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}
_CHECK_CHUNK = 1 << 22  # elements per chunk when validating pointers (bounded memory)


def dtype_code(dtype):
    for code, dt in DTYPES.items():
        if np.dtype(dt) == np.dtype(dtype):
            return code
    raise ValueError(f"dtype {dtype} has no code in the indexed-dataset format")


def optimal_dtype(vocab_size):
    """uint16 when every id fits (as Megatron-LM decides), else int32."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def index_file_path(prefix):
    return prefix + ".idx"


def data_file_path(prefix):
    return prefix + ".bin"


def normalize_prefix(path):
    """Accept 'x', 'x.bin' or 'x.idx' for the prefix 'x'."""
    return path[:-4] if path.endswith((".bin", ".idx")) else path


def read_header(idx_path):
    """-> (dtype, sequence count, document-index count). Raises DatasetError on a bad header."""
    if not os.path.isfile(idx_path):
        raise DatasetError(f"{idx_path} not found: --data-path takes the prefix written by "
                           "tools/preprocess_data.py (e.g. my-corpus_text_document, files .bin and .idx)")
    with open(idx_path, "rb") as fh:
        head = fh.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:len(MAGIC)] != MAGIC:
        raise DatasetError(f"{idx_path} is not a Megatron indexed-dataset index (bad header"
                           f"{', file too short' if len(head) < HEADER_BYTES else ''}); rebuild it with "
                           "tools/preprocess_data.py")
    version, code, num_seq, num_doc = struct.unpack("<QBQQ", head[len(MAGIC):])
    if version != VERSION:
        raise DatasetError(f"{idx_path}: index version {version} is not supported (only {VERSION})")
    if code not in DTYPES:
        raise DatasetError(f"{idx_path}: unknown dtype code {code} (corrupt index?)")
    return np.dtype(DTYPES[code]), num_seq, num_doc


def _validate(idx_path, bin_path, dtype, sizes, pointers, doc_idx):
    n = len(sizes)
    if len(doc_idx) < 1 or doc_idx[0] != 0 or doc_idx[-1] != n:
        raise DatasetError(f"{idx_path}: document indices must run from 0 to the sequence count {n} (corrupt index)")
    if not os.path.isfile(bin_path):
        raise DatasetError(f"{bin_path} not found (the .idx is there; was the .bin moved or deleted?)")
    offset = 0
    for start in range(0, n, _CHECK_CHUNK):  # pointers must be the running sum of sizes
        s = sizes[start:start + _CHECK_CHUNK].astype(np.int64)
        if (s < 0).any():
            raise DatasetError(f"{idx_path}: negative sequence size (corrupt index)")
        expected = offset + np.concatenate(([0], np.cumsum(s)[:-1])) * dtype.itemsize
        if not np.array_equal(pointers[start:start + _CHECK_CHUNK], expected):
            raise DatasetError(f"{idx_path}: sequence pointers do not match the sizes (corrupt index)")
        offset = int(expected[-1] + s[-1] * dtype.itemsize)
    for start in range(0, len(doc_idx) - 1, _CHECK_CHUNK):
        if (np.diff(doc_idx[start:start + _CHECK_CHUNK + 1]) < 0).any():
            raise DatasetError(f"{idx_path}: document indices decrease (corrupt index)")
    actual = os.path.getsize(bin_path)
    if actual != offset:
        raise DatasetError(f"{bin_path} has {actual} bytes but its index describes {offset} "
                           f"({offset // dtype.itemsize} tokens of {dtype.name}); the file is "
                           f"{'truncated' if actual < offset else 'longer than indexed'}, rebuild it")


class IndexedDataset:
    """Sequences of tokens from prefix.bin/.idx, memory-mapped and checked when opened.

    ds[i] -> np.ndarray [sizes[i]] of the file's dtype; ds.get(i, offset, length) -> a slice of it.
    """

    def __init__(self, path_prefix, mmap=True):
        self.path_prefix = normalize_prefix(path_prefix)
        idx_path, bin_path = index_file_path(self.path_prefix), data_file_path(self.path_prefix)
        self.dtype, num_seq, num_doc = read_header(idx_path)
        expected = HEADER_BYTES + num_seq * (4 + 8) + num_doc * 8
        actual = os.path.getsize(idx_path)
        if actual != expected:
            raise DatasetError(f"{idx_path} has {actual} bytes but its header describes {expected} "
                               f"({num_seq} sequences, {num_doc} document indices); the index is "
                               f"{'truncated' if actual < expected else 'corrupt'}, rebuild it")
        self._idx = np.memmap(idx_path, dtype=np.uint8, mode="r")
        self.sequence_lengths = np.frombuffer(self._idx, np.int32, num_seq, HEADER_BYTES)
        self.sequence_pointers = np.frombuffer(self._idx, np.int64, num_seq, HEADER_BYTES + 4 * num_seq)
        self.document_indices = np.frombuffer(self._idx, np.int64, num_doc, HEADER_BYTES + 12 * num_seq)
        _validate(idx_path, bin_path, self.dtype, self.sequence_lengths, self.sequence_pointers,
                  self.document_indices)
        self.bin_path, self.mmap = bin_path, mmap
        size = os.path.getsize(bin_path)
        # an empty file cannot be mapped; it also has nothing to read
        self._bin = np.memmap(bin_path, dtype=np.uint8, mode="r") if mmap and size else None

    def __len__(self):
        return len(self.sequence_lengths)

    @property
    def num_documents(self):
        return len(self.document_indices) - 1

    @property
    def num_tokens(self):
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def get(self, idx, offset=0, length=None):
        """Tokens [offset, offset + length) of sequence idx (to its end by default)."""
        size = int(self.sequence_lengths[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) of sequence {idx} of size {size}")
        start = int(self.sequence_pointers[idx]) + offset * self.dtype.itemsize
        if length == 0:
            return np.zeros(0, self.dtype)
        if self._bin is not None:
            return np.frombuffer(self._bin, self.dtype, length, start)
        with open(self.bin_path, "rb") as fh:
            fh.seek(start)
            return np.fromfile(fh, self.dtype, length)

    def __getitem__(self, idx):
        return self.get(idx)

    def document(self, doc):
        """Every token of document doc (its sequences joined)."""
        a, b = self.document_indices[doc], self.document_indices[doc + 1]
        return np.concatenate([self.get(i) for i in range(a, b)] or [np.zeros(0, self.dtype)])
