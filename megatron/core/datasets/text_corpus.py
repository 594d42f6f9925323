"""The embedded default corpus: Python standard-library source, present on every machine.

Documents are the .py files under the stdlib directory (sorted, tests and
site-packages excluded) up to a byte budget; every 50th document goes to validation.
Tokens are packed into samples of seq_length + 1 and visited in a shuffled order that
depends only on the seed.
"""
import os
import sysconfig

import numpy as np


def stdlib_documents(max_bytes):
    """Sorted stdlib source files as bytes, up to max_bytes in total."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests", "idlelib", "__pycache__"))
        paths += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    docs, total = [], 0
    for path in paths:
        with open(path, "rb") as fh:
            data = fh.read()
        if not data.strip():
            continue
        docs.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if not docs:
        raise FileNotFoundError(f"no Python source files found under {root}")
    return docs


class StdlibCorpusDataset:
    """One split ('train' or 'valid') of the stdlib corpus, byte-tokenised.

    Sample i (any i >= 0: later epochs reshuffle) is seq_length + 1 consecutive tokens.
    """

    def __init__(self, split, seq_length, seed, max_bytes, eod, tokenize=None):
        docs = stdlib_documents(max_bytes)
        keep = [d for i, d in enumerate(docs) if (i % 50 == 49) == (split == "valid")]
        pieces = []
        for d in keep:
            ids = tokenize(d.decode("utf-8", errors="replace")) if tokenize else np.frombuffer(d, dtype=np.uint8)
            pieces += [np.asarray(ids, dtype=np.int64), np.array([eod], dtype=np.int64)]
        self.stream = np.concatenate(pieces)
        self.seq_length, self.seed = seq_length, seed
        self.per_epoch = (len(self.stream) - 1) // seq_length
        if self.per_epoch < 1:
            raise ValueError(f"the {split} corpus ({len(self.stream)} tokens) is shorter than one sample")
        self._orders = {}

    def __len__(self):
        return self.per_epoch

    def _order(self, epoch):
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.per_epoch)}
        return self._orders[epoch]

    def __getitem__(self, idx):
        epoch, i = divmod(idx, self.per_epoch)
        start = int(self._order(epoch)[i]) * self.seq_length
        return {"tokens": self.stream[start: start + self.seq_length + 1].copy()}
