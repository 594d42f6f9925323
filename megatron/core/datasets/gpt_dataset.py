"""GPTDataset: documents of an indexed dataset packed into samples of seq_length + 1 tokens.

Three index arrays, built as Megatron-LM builds them (same RNG calls, same layout):

    document_index [epochs x documents]   the split's document ids, each epoch shuffled
                                          (numpy RandomState(seed));
    sample_index   [samples + 1, 2]       where sample i starts: (entry of document_index, offset)
                                          (helpers.build_sample_idx: C++ or numpy);
    shuffle_index  [samples]              the order samples are served in.

Epochs are added until num_samples samples fit. If the last epoch would be used for less than
80% of its samples, it is shuffled separately (so the partial epoch is a uniform subset).
Nothing depends on the rank or the data-parallel size.
"""
import hashlib
from dataclasses import dataclass

import numpy as np

from . import helpers
from .index_cache import INDEX_FORMAT, build_or_load, fingerprint
from .indexed_dataset import DatasetError

_SEPARATE_FINAL_EPOCH = 0.80


@dataclass
class GPTDatasetConfig:
    seq_length: int
    seed: int
    cache_dir: str | None = None   # None: build the indices in memory every time
    vocab_size: int | None = None  # when set, a token id >= vocab_size is a DatasetError
    tokenizer: dict | None = None  # the run's tokenizer record: a dataset's own must match (tokenizer_record.py)
    add_extra_token: int = 1          # samples are seq_length + 1 tokens (inputs and shifted labels)
    mmap_bin_files: bool = True       # False: the .bin files are read with file reads (--no-mmap-bin-files)


class GPTDataset:
    """Sample i -> {"tokens": int64 [seq_length + 1]}, for 0 <= i < len(self) (>= num_samples).

    indexed: IndexedDataset; documents: int array of its sequence ids in this split (one
    sequence per document, as preprocess_data.py writes them); split: a name for messages
    and the cache.
    """

    def __init__(self, indexed, documents, num_samples, split, config):
        self.indexed, self.config, self.split = indexed, config, split
        self.documents = np.asarray(documents, dtype=np.int32)
        self.num_samples = int(num_samples)
        if len(self.documents) == 0:
            raise DatasetError(f"{indexed.path_prefix}: the {split} split has no documents")
        self.tokens_per_epoch = int(indexed.sequence_lengths[self.documents].sum(dtype=np.int64))
        if self.tokens_per_epoch < 2:
            raise DatasetError(f"{indexed.path_prefix}: the {split} split ({len(self.documents)} documents) "
                               f"holds {self.tokens_per_epoch} tokens, too few for one sample")
        self.description = {
            "class": "GPTDataset", "format": INDEX_FORMAT, "data": fingerprint(indexed), "split": split,
            "documents": [int(self.documents[0]), int(self.documents[-1]) + 1, len(self.documents),
                          hashlib.md5(self.documents.tobytes()).hexdigest()],
            "num_samples": self.num_samples, "seq_length": config.seq_length, "seed": config.seed,
            "add_extra_token": config.add_extra_token}
        arrays, self.cache_key, self.built = build_or_load(
            config.cache_dir, "GPTDataset", self.description,
            ["document_index", "sample_index", "shuffle_index"], self._build)
        self.document_index = arrays["document_index"]
        self.sample_index = arrays["sample_index"]
        self.shuffle_index = arrays["shuffle_index"]

    def num_epochs(self):
        """Fewest epochs whose tokens cover num_samples samples (+ the extra token)."""
        needed = self.num_samples * self.config.seq_length + self.config.add_extra_token
        return max(1, -(-needed // self.tokens_per_epoch))

    def _build(self):
        s, extra, tokens = self.config.seq_length, self.config.add_extra_token, self.tokens_per_epoch
        epochs = self.num_epochs()
        separate_final = False
        if epochs > 1:  # is the last epoch only partly used?
            before_final = ((epochs - 1) * tokens - extra) // s
            per_epoch = (tokens - extra) // s
            separate_final = (self.num_samples - before_final) < int(_SEPARATE_FINAL_EPOCH * per_epoch)
        rng = np.random.RandomState(self.config.seed)
        if separate_final:
            document_index = np.concatenate([_document_index(self.documents, epochs - 1, rng),
                                             _document_index(self.documents, 1, rng)])
        else:
            document_index = _document_index(self.documents, epochs, rng)
        sample_index = helpers.build_sample_idx(self.indexed.sequence_lengths, document_index, s, epochs,
                                                tokens, extra)
        total = sample_index.shape[0] - 1
        first = ((epochs - 1) * tokens - extra) // s if separate_final else total
        return {"document_index": document_index, "sample_index": sample_index,
                "shuffle_index": _shuffle_index(first, total, rng)}

    def __len__(self):
        return len(self.shuffle_index)

    def __getitem__(self, idx):
        i = int(self.shuffle_index[idx])
        (j0, o0), (j1, o1) = self.sample_index[i], self.sample_index[i + 1]
        j0, o0, j1, o1 = int(j0), int(o0), int(j1), int(o1)
        doc = self.document_index
        if j0 == j1:
            parts = [self.indexed.get(int(doc[j0]), o0, o1 - o0 + self.config.add_extra_token)]
        else:  # first document from o0, whole documents between, last one up to o1 (inclusive)
            parts = [self.indexed.get(int(doc[j0]), o0)]
            parts += [self.indexed.get(int(doc[j])) for j in range(j0 + 1, j1)]
            parts.append(self.indexed.get(int(doc[j1]), 0, o1 + self.config.add_extra_token))
        tokens = np.concatenate(parts).astype(np.int64)
        assert len(tokens) == self.config.seq_length + self.config.add_extra_token, (idx, len(tokens))
        vocab = self.config.vocab_size
        if vocab is not None and len(tokens) and (tokens.max() >= vocab or tokens.min() < 0):
            raise DatasetError(f"{self.indexed.path_prefix}: token id {int(tokens.max())} is outside the "
                               f"tokenizer's vocabulary (size {vocab}); preprocess the data with the "
                               "--tokenizer-type (and files) you train with")
        return {"tokens": tokens}


def _document_index(documents, epochs, rng):
    """[epochs x documents] int32: the document ids once per epoch, then shuffled as a whole."""
    index = np.tile(documents.astype(np.int32), epochs)
    rng.shuffle(index)
    return index


def _shuffle_index(first, total, rng):
    """A permutation of range(total) that shuffles [0, first) and [first, total) separately."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    head = np.arange(first, dtype=dtype)
    rng.shuffle(head)
    if first == total:
        return head
    tail = np.arange(first, total, dtype=dtype)
    rng.shuffle(tail)
    return np.concatenate([head, tail])
