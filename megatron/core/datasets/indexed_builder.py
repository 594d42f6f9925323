"""Writing the indexed format (see indexed_dataset.py) with memory that stays flat.

Tokens stream to prefix.bin.partial; sequence sizes and document boundaries are buffered
in small arrays and spilled to side files, so a corpus larger than RAM costs only the
buffers. finalize() writes prefix.idx.partial from the side files (pointers computed chunk
by chunk), then renames both into place: a crash never leaves a .bin/.idx pair that looks
complete.
"""
import os
import shutil
import struct
from array import array

import numpy as np

from .indexed_dataset import (
    HEADER_BYTES,
    MAGIC,
    VERSION,
    DatasetError,
    IndexedDataset,
    data_file_path,
    dtype_code,
    index_file_path,
)

_SPILL = 1 << 20  # entries buffered before a side-file write
_COPY = 1 << 24   # bytes per chunk when copying another dataset's .bin


class IndexedDatasetBuilder:
    """builder = IndexedDatasetBuilder(prefix, np.uint16); builder.add_document(ids, [len(ids)]); ...
    builder.finalize() -> writes prefix.bin and prefix.idx."""

    def __init__(self, path_prefix, dtype):
        self.prefix, self.dtype = path_prefix, np.dtype(dtype)
        self._code = dtype_code(self.dtype)
        self._bin = open(data_file_path(path_prefix) + ".partial", "wb")
        self._sizes_path = index_file_path(path_prefix) + ".sizes.partial"
        self._docs_path = index_file_path(path_prefix) + ".docs.partial"
        self._sizes_file, self._docs_file = open(self._sizes_path, "wb"), open(self._docs_path, "wb")
        self._sizes, self._docs = array("i"), array("q", [0])
        self.num_sequences = 0
        self.num_doc_indices = 1

    def add_item(self, ids):
        """One sequence (1-D ints); it joins the current document."""
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ValueError(f"a sequence must be 1-D, got shape {arr.shape}")
        if arr.size and arr.dtype != self.dtype:
            info = np.iinfo(self.dtype) if self.dtype.kind in "iu" else None
            if info is not None and (arr.min() < info.min or arr.max() > info.max):
                raise DatasetError(f"token id out of range for {self.dtype.name} "
                                   f"[{arr.min()}, {arr.max()}]; use a wider dtype")
            arr = arr.astype(self.dtype)
        self._bin.write(arr.tobytes(order="C"))
        self._sizes.append(arr.size)
        self.num_sequences += 1
        if len(self._sizes) >= _SPILL:
            self._sizes.tofile(self._sizes_file)
            self._sizes = array("i")

    def end_document(self):
        self._docs.append(self.num_sequences)
        self.num_doc_indices += 1
        if len(self._docs) >= _SPILL:
            self._docs.tofile(self._docs_file)
            self._docs = array("q")

    def add_document(self, ids, lengths):
        """A document of len(lengths) sequences whose tokens are `ids` back to back (Megatron's API)."""
        arr = np.asarray(ids)
        start = 0
        for n in lengths:
            self.add_item(arr[start:start + n])
            start += n
        self.end_document()

    def add_index(self, path_prefix):
        """Append every document of another dataset (same dtype), streaming its .bin."""
        other = IndexedDataset(path_prefix)
        if other.dtype != self.dtype:
            raise DatasetError(f"{path_prefix} holds {other.dtype.name} tokens, not {self.dtype.name}; "
                               "datasets can only be merged with one dtype")
        with open(other.bin_path, "rb") as fh:
            shutil.copyfileobj(fh, self._bin, _COPY)
        base = self.num_sequences
        for start in range(0, len(other), _SPILL):
            self._sizes.extend(other.sequence_lengths[start:start + _SPILL].tolist())
            self._sizes.tofile(self._sizes_file)
            self._sizes = array("i")
        self.num_sequences += len(other)
        for start in range(1, len(other.document_indices), _SPILL):
            self._docs.extend((other.document_indices[start:start + _SPILL] + base).tolist())
            self._docs.tofile(self._docs_file)
            self._docs = array("q")
        self.num_doc_indices += len(other.document_indices) - 1

    def finalize(self, idx_path=None):
        """Write the .idx and move both files into place. idx_path defaults to prefix.idx."""
        idx_path = idx_path or index_file_path(self.prefix)
        self._sizes.tofile(self._sizes_file)
        self._docs.tofile(self._docs_file)
        for fh in (self._bin, self._sizes_file, self._docs_file):
            fh.close()
        with open(idx_path + ".partial", "wb") as out:
            out.write(MAGIC + struct.pack("<QBQQ", VERSION, self._code, self.num_sequences, self.num_doc_indices))
            with open(self._sizes_path, "rb") as fh:
                shutil.copyfileobj(fh, out, _COPY)
            offset = 0
            for chunk in _chunks(self._sizes_path, np.int32):  # pointers: running byte offsets
                nbytes = chunk.astype(np.int64) * self.dtype.itemsize
                ptr = offset + np.cumsum(nbytes) - nbytes
                out.write(ptr.astype("<i8").tobytes())
                offset += int(nbytes.sum())
            with open(self._docs_path, "rb") as fh:
                shutil.copyfileobj(fh, out, _COPY)
        assert os.path.getsize(idx_path + ".partial") == \
            HEADER_BYTES + 12 * self.num_sequences + 8 * self.num_doc_indices
        os.replace(data_file_path(self.prefix) + ".partial", data_file_path(self.prefix))
        os.replace(idx_path + ".partial", idx_path)
        os.remove(self._sizes_path)
        os.remove(self._docs_path)

    def abort(self):
        """Close and delete the partial files (after an error)."""
        for fh in (self._bin, self._sizes_file, self._docs_file):
            fh.close()
        for path in (data_file_path(self.prefix) + ".partial", self._sizes_path, self._docs_path,
                     index_file_path(self.prefix) + ".partial"):
            if os.path.exists(path):
                os.remove(path)


def _chunks(path, dtype):
    with open(path, "rb") as fh:
        while True:
            chunk = np.fromfile(fh, dtype, _SPILL)
            if not chunk.size:
                return
            yield chunk
