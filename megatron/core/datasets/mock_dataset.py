"""Deterministic synthetic tokens, for tests and benchmarks."""
import numpy as np


class MockGPTDataset:
    """Sample i: an arithmetic sequence mod (vocab_size - 1) from a start and step drawn
    with seed (seed, i), then end-of-document. Learnable (the next token follows from the
    previous two), identical on every rank and machine.
    """

    def __init__(self, num_samples, seq_length, vocab_size, seed, eod):
        self.num_samples, self.seq_length = num_samples, seq_length
        self.vocab_size, self.seed, self.eod = vocab_size, seed, eod

    def __len__(self):
        return self.num_samples

    def __getitem__(self, idx):
        rng = np.random.default_rng([self.seed, idx])
        modulus = max(self.vocab_size - 1, 1)
        start, step = rng.integers(0, modulus), rng.integers(1, max(modulus, 2))
        length = int(rng.integers(self.seq_length // 2, self.seq_length + 1))
        tokens = np.full(self.seq_length + 1, self.eod, dtype=np.int64)
        tokens[:length] = (start + step * np.arange(length)) % modulus
        return {"tokens": tokens}
