"""The smallest and largest token id of an indexed dataset, computed once and cached with the indices.

Data tokenized by another tokenizer than the one trained with shows up as ids at or above the
vocabulary. Reading one sample finds it only if that sample holds such an id; one pass over the
whole .bin (numpy, in chunks of bounded memory) finds it always, and is cached in the index cache
(keyed by the dataset's fingerprint), so it runs once per dataset, not once per run.
"""
import numpy as np

from .index_cache import INDEX_FORMAT, build_or_load, fingerprint
from .indexed_dataset import DatasetError

_CHUNK = 1 << 24  # tokens per chunk of the pass over the .bin


def token_range(indexed, cache_dir=None):
    """(min id, max id) over every token of indexed (an IndexedDataset); (0, -1) when it has none.
    cache_dir: the index cache folder (None: computed every time)."""
    description = {"class": "TokenRange", "format": INDEX_FORMAT, "data": fingerprint(indexed)}
    arrays, _, _ = build_or_load(cache_dir, "TokenRange", description, ["min_max"],
                                 lambda: {"min_max": _scan(indexed)})
    low, high = (int(x) for x in arrays["min_max"])
    return low, high


def _scan(indexed):
    if indexed.num_tokens == 0:
        return np.array([0, -1], dtype=np.int64)
    tokens = np.memmap(indexed.bin_path, dtype=indexed.dtype, mode="r")
    lows, highs = zip(*((int(c.min()), int(c.max())) for c in
                        (tokens[i:i + _CHUNK] for i in range(0, len(tokens), _CHUNK))))
    return np.array([min(lows), max(highs)], dtype=np.int64)


def check_token_ids(indexed, vocab_size, cache_dir=None):
    """DatasetError naming the data, its largest (or a negative) id and the vocabulary size unless
    every token id of indexed is in [0, vocab_size). vocab_size None: nothing to check."""
    if vocab_size is None:
        return
    low, high = token_range(indexed, cache_dir)
    if high >= vocab_size or low < 0:
        bad = high if high >= vocab_size else low
        raise DatasetError(f"{indexed.path_prefix}: token id {bad} (the data's ids run {low}..{high}) is outside "
                           f"the tokenizer's vocabulary (size {vocab_size}); preprocess the data with the "
                           "--tokenizer-type (and files) you train with, or train with the tokenizer it was made with")
