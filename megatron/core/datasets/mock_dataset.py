"""Deterministic synthetic tokens, for tests and benchmarks."""
import numpy as np

from .bert_dataset import BertDatasetConfig
from .bert_sample import build_sample
from .indexed_dataset import DatasetError


class MockGPTDataset:
    """Sample i: an arithmetic sequence mod (vocab_size - 1) from a start and step drawn
    with seed (seed, i), then end-of-document. Learnable (the next token follows from the
    previous two), identical on every rank and machine.

    With mean_document_length (--mock-document-length) a sample packs several such documents instead, each
    ended by end-of-document, of lengths drawn (seeded) from an exponential distribution of that mean, the
    last one cut at the sample's end: the packed samples --reset-attention-mask is for.
    """

    def __init__(self, num_samples, seq_length, vocab_size, seed, eod, mean_document_length=None):
        self.num_samples, self.seq_length = num_samples, seq_length
        self.vocab_size, self.seed, self.eod = vocab_size, seed, eod
        self.mean_document_length = mean_document_length

    def __len__(self):
        return self.num_samples

    def __getitem__(self, idx):
        rng = np.random.default_rng([self.seed, idx])
        if self.mean_document_length:
            return {"tokens": self._packed(rng)}
        modulus = max(self.vocab_size - 1, 1)
        start, step = rng.integers(0, modulus), rng.integers(1, max(modulus, 2))
        length = int(rng.integers(self.seq_length // 2, self.seq_length + 1))
        tokens = np.full(self.seq_length + 1, self.eod, dtype=np.int64)
        tokens[:length] = (start + step * np.arange(length)) % modulus
        return {"tokens": tokens}

    def _packed(self, rng):
        modulus = max(self.vocab_size - 1, 1)
        tokens = np.empty(self.seq_length + 1, dtype=np.int64)
        at = 0
        while at < len(tokens):
            length = min(max(1, int(rng.exponential(self.mean_document_length))), len(tokens) - at)
            start, step = rng.integers(0, modulus), rng.integers(1, max(modulus, 2))
            tokens[at:at + length] = (start + step * np.arange(length)) % modulus
            tokens[at + length - 1] = self.eod
            at += length
        return tokens


def mock_bert_special_ids(vocab_size):
    """Special ids for synthetic BERT data: the top four of the vocabulary (a NullTokenizer has
    none), so the text ids [0, vocab_size - 4) stay contiguous. -> dict of cls/sep/mask/pad ids."""
    if vocab_size < 6:
        raise DatasetError(f"mock BERT data needs a vocabulary of at least 6 ids, got {vocab_size}; "
                           "raise --vocab-size")
    return {"cls_id": vocab_size - 4, "sep_id": vocab_size - 3, "mask_id": vocab_size - 2, "pad_id": vocab_size - 1}


class MockBertDataset:
    """BertDataset's samples from synthetic documents: document i is an arithmetic sequence mod
    (vocab_size - 4) from a start and step drawn with seed (seed, i), cut into sentences of random
    length. The order of A and B is then visible in the ids, so SOP is learnable. Special ids:
    mock_bert_special_ids (also on self.config).
    """

    def __init__(self, num_samples, seq_length, vocab_size, seed, masked_lm_prob=0.15, short_seq_prob=0.1,
                 binary_head=True, binary_head_task="sop"):
        self.num_samples = num_samples
        self.config = BertDatasetConfig(seq_length=seq_length, seed=seed, vocab_size=vocab_size,
                                        masked_lm_prob=masked_lm_prob, short_seq_prob=short_seq_prob,
                                        binary_head=binary_head, binary_head_task=binary_head_task,
                                        **mock_bert_special_ids(vocab_size))

    def __len__(self):
        return self.num_samples

    def _document(self, rng, tokens):
        """Sentences (at least two) of one synthetic document holding at least `tokens` ids."""
        modulus = self.config.vocab_size - 4
        start, step = rng.integers(0, modulus), rng.integers(1, max(modulus, 2))
        longest = max(2, self.config.max_target // 4)
        lengths = []
        while sum(lengths) < tokens or len(lengths) < 2:
            lengths.append(int(rng.integers(1, longest + 1)))
        ids = (start + step * np.arange(sum(lengths))) % modulus
        return np.split(ids.astype(np.int64), np.cumsum(lengths)[:-1])

    def __getitem__(self, idx):
        config = self.config
        rng = np.random.default_rng([config.seed, idx])
        short = rng.random() < config.short_seq_prob
        target = int(rng.integers(2, config.max_target + 1)) if short else config.max_target
        return build_sample(self._document(rng, target), target, rng, config,
                            lambda r: self._document(r, 2 * config.max_target))
