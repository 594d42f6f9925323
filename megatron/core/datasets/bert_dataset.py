"""BertDataset: runs of consecutive sentences of one document, made into masked-LM samples.

The data is an indexed dataset written with --split-sentences: each sequence is one sentence,
each document (the .idx document index) a list of sentences. A cached mapping (see
helpers.build_bert_mapping: C++ or numpy, identical) lists every sample as (first sentence, end
sentence, target tokens) in served order; __getitem__ turns row idx into a sample with a numpy
Generator seeded by (seed, idx), so a sample depends on nothing but the data, the config and idx.

Sample (numpy):
    text          int64 [seq_length]  [CLS] A [SEP] B [SEP] [PAD]... (no binary head: [CLS] A [SEP])
    types         int64 [seq_length]  0 for [CLS], A and its [SEP]; 1 for B and its [SEP]; 0 on padding
    labels        int64 [seq_length]  the original id where masked, else 0 (read with loss_mask)
    loss_mask     float32 [seq_length] 1 where masked
    padding_mask  int64 [seq_length]  1 on real tokens, 0 on padding
    is_random     int64 []            SOP: A and B swapped; NSP: B from another document
"""
import hashlib
from dataclasses import dataclass

import numpy as np

from . import helpers
from .bert_sample import build_sample, special_tokens
from .index_cache import INDEX_FORMAT, build_or_load, fingerprint
from .indexed_dataset import DatasetError

_EPOCH_CAP = 1 << 30  # epochs are added until num_samples rows exist; this only bounds the loop


@dataclass
class BertDatasetConfig:
    seq_length: int
    seed: int
    vocab_size: int                 # random replacements are drawn below it; larger ids are a DatasetError
    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int
    cache_dir: str | None = None  # None: build the mapping in memory every time
    tokenizer: dict | None = None  # the run's tokenizer record: a dataset's own must match (tokenizer_record.py)
    masked_lm_prob: float = 0.15    # share of the non-special tokens masked (at least one)
    short_seq_prob: float = 0.1     # share of samples with a shorter random target length
    binary_head: bool = True        # sentence pairs (A, B) with is_random; False: one segment
    binary_head_task: str = "sop"   # "sop": B A order swapped; "nsp": B from another document
    mmap_bin_files: bool = True       # False: the .bin files are read with file reads (--no-mmap-bin-files)

    def __post_init__(self):
        if self.binary_head_task not in ("sop", "nsp"):
            raise ValueError(f"binary_head_task must be 'sop' or 'nsp', got {self.binary_head_task!r}")
        for name in ("masked_lm_prob", "short_seq_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.max_target < 2:
            raise DatasetError(f"--seq-length {self.seq_length} leaves fewer than 2 tokens besides the "
                               f"{special_tokens(self.binary_head)} special tokens of a BERT sample; raise it")
        if self.vocab_size <= len({self.cls_id, self.sep_id, self.mask_id, self.pad_id}):
            raise DatasetError(f"the vocabulary (size {self.vocab_size}) holds no token besides BERT's special ids; "
                               "use the tokenizer the data was made with")

    @property
    def max_target(self):
        """Most sentence tokens in one sample: seq_length less the special tokens."""
        return self.seq_length - special_tokens(self.binary_head)

    @property
    def min_num_sent(self):
        """Sentences a sample needs: 2 for a pair, 1 without the binary head."""
        return 2 if self.binary_head else 1


class BertDataset:
    """Sample i -> the dict above, for 0 <= i < len(self) (>= num_samples: whole epochs).

    indexed: IndexedDataset of sentences; documents: int array of its document ids in this split
    (ascending); split: a name for messages and the cache.
    """

    def __init__(self, indexed, documents, num_samples, split, config):
        self.indexed, self.config, self.split = indexed, config, split
        self.documents = np.sort(np.asarray(documents, dtype=np.int64))
        self.num_samples = int(num_samples)
        if len(self.documents) == 0:
            raise DatasetError(f"{indexed.path_prefix}: the {split} split has no documents")
        self.doc_starts = np.asarray(indexed.document_indices[self.documents], dtype=np.int64)
        self.doc_ends = np.asarray(indexed.document_indices[self.documents + 1], dtype=np.int64)
        self._check_documents()
        nonempty = self.doc_ends > self.doc_starts
        self._other_starts, self._other_ends = self.doc_starts[nonempty], self.doc_ends[nonempty]
        self.description = {
            "class": "BertDataset", "format": INDEX_FORMAT, "data": fingerprint(indexed), "split": split,
            "documents": [int(self.documents[0]), int(self.documents[-1]) + 1, len(self.documents),
                          hashlib.md5(self.documents.tobytes()).hexdigest()],
            "num_samples": self.num_samples, "max_target": config.max_target, "seed": config.seed,
            "short_seq_prob": config.short_seq_prob, "min_num_sent": config.min_num_sent}
        arrays, self.cache_key, self.built = build_or_load(config.cache_dir, "BertDataset", self.description,
                                                           ["mapping"], self._build)
        self.mapping = arrays["mapping"]
        if len(self.mapping) < self.num_samples:  # only if a cap or a bug stopped the epochs early
            raise DatasetError(f"{indexed.path_prefix}: the {split} split gives {len(self.mapping)} BERT "
                               f"samples, fewer than the {self.num_samples} needed")

    def _check_documents(self):
        """Fail with what to do when no document can give a sample (the mapping would be empty)."""
        c, prefix = self.config, self.indexed.path_prefix
        enough = (self.doc_ends - self.doc_starts) >= c.min_num_sent
        if not enough.any():
            need = "2 or more sentences" if c.min_num_sent == 2 else "a sentence"
            raise DatasetError(f"{prefix}: in the {self.split} split ({len(self.documents)} documents) no document "
                               f"has {need}: preprocess with --split-sentences (one sequence per sentence)")
        starts, ends = self.doc_starts[enough], self.doc_ends[enough]
        lo, hi = int(starts.min()), int(ends.max())
        sizes = np.append(self.indexed.sequence_lengths[lo:hi], 0)  # the 0: a bound for a range ending at hi
        longest = np.maximum.reduceat(sizes, np.stack([starts - lo, ends - lo], axis=1).ravel())[::2]
        if not (longest <= c.max_target).any():
            raise DatasetError(f"{prefix}: every document of the {self.split} split with {c.min_num_sent} or more "
                               f"sentences has a sentence longer than {c.max_target} tokens (--seq-length "
                               f"{c.seq_length} less {special_tokens(c.binary_head)} special tokens); raise "
                               "--seq-length or preprocess with --split-sentences")

    def _build(self):
        config = self.config
        mapping = helpers.build_bert_mapping(self.doc_starts, self.doc_ends, self.indexed.sequence_lengths,
                                             _EPOCH_CAP, self.num_samples, config.max_target, config.short_seq_prob,
                                             config.seed, config.min_num_sent)
        return {"mapping": mapping}

    def __len__(self):
        return len(self.mapping)

    def _sentences(self, first, end):
        sentences = [self.indexed.get(i).astype(np.int64) for i in range(first, end)]
        vocab = self.config.vocab_size
        for s in sentences:
            if len(s) and (s.max() >= vocab or s.min() < 0):
                raise DatasetError(f"{self.indexed.path_prefix}: token id {int(s.max())} is outside the "
                                   f"tokenizer's vocabulary (size {vocab}); preprocess the data with the "
                                   "--tokenizer-type (and files) you train with")
        return sentences

    def __getitem__(self, idx):
        first, end, target = (int(x) for x in self.mapping[idx])
        rng = np.random.default_rng([self.config.seed, int(idx)])

        def random_document(rng):
            """Every sentence of a random non-empty split document other than this sample's own."""
            n = len(self._other_starts)
            if n < 2:
                return None
            own = int(np.searchsorted(self._other_starts, first, side="right")) - 1
            j = int(rng.integers(n - 1))
            j += j >= own
            return self._sentences(int(self._other_starts[j]), int(self._other_ends[j]))

        return build_sample(self._sentences(first, end), target, rng, self.config, random_document)


def collate_bert(samples, device=None):
    """Stack samples into one microbatch of torch tensors on device.

    -> tokens int64 [b, s] (from text), types int64 [b, s], labels int64 [b, s], loss_mask float32
    [b, s], padding_mask bool [b, s], is_random int64 [b]. Other keys (e.g. dataset_id) are dropped.
    torch is imported here so that the datasets package itself needs only numpy.
    """
    import torch

    def stack(key, dtype):
        return torch.from_numpy(np.stack([np.asarray(s[key]) for s in samples])).to(device=device, dtype=dtype)

    return {"tokens": stack("text", torch.int64), "types": stack("types", torch.int64),
            "labels": stack("labels", torch.int64), "loss_mask": stack("loss_mask", torch.float32),
            "padding_mask": stack("padding_mask", torch.bool), "is_random": stack("is_random", torch.int64)}
