"""Dataset index helpers: the C++ extension (csrc/helpers.cpp) when built, else numpy.

Both implementations give identical arrays (tests compare them exactly); the numpy ones
are the reference and the fallback. impl=None picks C++ when importable, "cpp" / "numpy"
force one.
"""
import sys

import numpy as np

try:
    from . import helpers_cpp
except ImportError:  # not built (pip install -e . compiles it): the numpy path works, slower
    helpers_cpp = None
if helpers_cpp is not None and not hasattr(helpers_cpp, "build_greedy_blending_indices"):
    helpers_cpp = None  # built from an older csrc/helpers.cpp: use numpy (and warn) until it is rebuilt

_warned = False
INT32_MAX = np.iinfo(np.int32).max


def _pick(impl):
    global _warned
    if impl == "numpy" or (impl is None and helpers_cpp is None):
        if impl is None and not _warned:
            _warned = True
            print("warning: megatron.core.datasets.helpers_cpp is not built (pip install -e . compiles "
                  "csrc/helpers.cpp); building dataset indices with numpy instead", file=sys.stderr, flush=True)
        return "numpy"
    if helpers_cpp is None:
        raise ImportError("megatron.core.datasets.helpers_cpp is not built; pip install -e . compiles it")
    return "cpp"


def sample_idx_dtype(document_index):
    return np.int32 if len(document_index) <= INT32_MAX else np.int64


def build_sample_idx(sizes, document_index, seq_length, num_epochs, tokens_per_epoch, add_extra_token=1,
                     impl=None):
    """Where each packed sample starts, as (entry of document_index, token offset in that document).

    sizes: int32 [documents in the dataset]; document_index: int32 [epochs x documents of the split],
    document ids in reading order. The documents are read as one token stream; boundary i is stream
    position i * seq_length (boundary 0 is (0, 0); later ones lie in a non-empty document). Sample i is
    boundary i to boundary i + 1 inclusive: seq_length + add_extra_token tokens.
    Returns [num_samples + 1, 2] (int32, or int64 for a document index beyond int32),
    num_samples = (num_epochs * tokens_per_epoch - add_extra_token) // seq_length.
    """
    sizes = np.ascontiguousarray(sizes, dtype=np.int32)
    document_index = np.ascontiguousarray(document_index, dtype=np.int32)
    dtype = sample_idx_dtype(document_index)
    if _pick(impl) == "cpp":
        return helpers_cpp.build_sample_idx(sizes, document_index, int(seq_length), int(num_epochs),
                                            int(tokens_per_epoch), int(add_extra_token), dtype == np.int64)
    return build_sample_idx_numpy(sizes, document_index, seq_length, num_epochs, tokens_per_epoch,
                                  add_extra_token, dtype)


def build_sample_idx_numpy(sizes, document_index, seq_length, num_epochs, tokens_per_epoch, add_extra_token=1,
                           dtype=np.int32):
    """The reference: searchsorted over the running document ends (O(samples log documents))."""
    num_samples = (num_epochs * tokens_per_epoch - add_extra_token) // seq_length
    if num_samples < 0 or (len(document_index) == 0 and num_samples > 0):
        raise ValueError("fewer tokens than one sample")
    out = np.zeros((num_samples + 1, 2), dtype=dtype)
    if num_samples == 0:
        return out
    doc_sizes = sizes[document_index].astype(np.int64)
    ends = np.cumsum(doc_sizes)  # stream position just past each document
    pos = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    if pos[-1] >= ends[-1]:
        raise IndexError("the document index holds fewer tokens than num_epochs * tokens_per_epoch")
    j = np.searchsorted(ends, pos, side="right")  # the first document ending after pos contains it
    j[0] = 0  # boundary 0 is (0, 0) even when the first document is empty
    out[:, 0] = j
    out[:, 1] = pos - (ends - doc_sizes)[j]
    return out


BLEND_ORDERS = ("megatron", "tijdeman")


def build_blending_indices(weights, size, impl=None, order="megatron"):
    """Which dataset, and which of its samples, each of `size` blended samples comes from.

    weights: [k] positive, summing to 1. order "megatron" (Megatron-LM's greedy rule): sample i
    goes to the dataset with the largest weights[d] x max(i, 1) - taken[d] (ties: lowest index);
    a dataset can lag its share by about 1.6 samples. order "tijdeman": after every prefix of n
    samples, dataset d has been taken within 1 - 1/(2k - 2) of weights[d] x n times (Tijdeman's
    chairman assignment; see csrc/helpers.cpp). Returns (dataset_index int16 [size],
    dataset_sample_index int64 [size]).
    """
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    if len(weights) < 1 or not (weights > 0).all():
        raise ValueError(f"blending weights must be positive, got {weights.tolist()}")
    if order not in BLEND_ORDERS:
        raise ValueError(f"blend order must be one of {BLEND_ORDERS}, got {order!r}")
    if _pick(impl) == "cpp":
        dataset_index = np.zeros(size, dtype=np.int16)
        dataset_sample_index = np.zeros(size, dtype=np.int64)
        build = helpers_cpp.build_blending_indices if order == "tijdeman" else helpers_cpp.build_greedy_blending_indices
        build(dataset_index, dataset_sample_index, weights, int(size))
        return dataset_index, dataset_sample_index
    if order == "tijdeman":
        return build_blending_indices_numpy(weights, size)
    return build_greedy_blending_indices_numpy(weights, size)


def build_greedy_blending_indices_numpy(weights, size):
    """The reference for Megatron-LM's order, in Python floats (the C++'s operations in order)."""
    w = [float(x) for x in weights]
    taken = [0] * len(w)
    choice, nth = [0] * size, [0] * size
    for i in range(size):
        x = max(float(i), 1.0)  # Megatron-LM's rule: samples 0 and 1 both measure against 1
        best, best_error = 0, w[0] * x - float(taken[0])
        for d in range(1, len(w)):
            error = w[d] * x - float(taken[d])
            if error > best_error:
                best, best_error = d, error
        choice[i], nth[i] = best, taken[best]
        taken[best] += 1
    return np.array(choice, dtype=np.int16), np.array(nth, dtype=np.int64)


def build_blending_indices_numpy(weights, size):
    """The reference for Tijdeman's order: Python floats (IEEE doubles, the C++'s operations in order)."""
    w = [float(x) for x in weights]
    k = len(w)
    sigma = 1.0 / float(2 * k - 2) if k > 1 else 0.0
    taken = [0] * k
    choice, nth = [0] * size, [0] * size
    for i in range(size):
        n = float(i + 1)
        best, best_due, behind, most_behind = -1, 0.0, 0, 0.0
        for d in range(k):
            deficit = w[d] * n - float(taken[d])
            if d == 0 or deficit > most_behind:
                behind, most_behind = d, deficit
            if deficit >= sigma:
                due = (float(taken[d]) + 1.0 - sigma) / w[d]
                if best < 0 or due < best_due:
                    best, best_due = d, due
        if best < 0:
            best = behind
        choice[i], nth[i] = best, taken[best]
        taken[best] += 1
    return np.array(choice, dtype=np.int16), np.array(nth, dtype=np.int64)


_MASK64 = (1 << 64) - 1


class SplitMix64:
    """splitmix64, exactly as csrc/helpers.cpp draws it (the BERT mapping's only RNG)."""

    def __init__(self, seed):
        self.state = int(seed) & _MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def uniform(self):
        return float(self.next() >> 11) * (1.0 / 9007199254740992.0)


def _bert_target(rng, short_seq_prob, max_target):
    u = rng.uniform()
    short_len = 2 + rng.below(max_target - 1)
    return short_len if u < short_seq_prob else max_target


def build_bert_mapping(doc_starts, doc_ends, sizes, num_epochs, max_num_samples, max_target, short_seq_prob,
                       seed, min_num_sent, impl=None):
    """BERT samples as runs of whole sentences: [rows, 3] = (first sentence, end sentence, target tokens).

    Document d is sentences [doc_starts[d], doc_ends[d]) with token counts sizes (int32, one per
    sentence). Documents with fewer than min_num_sent sentences, or with a sentence longer than
    max_target tokens, give no rows. The rest are cut greedily per epoch into runs of at least
    min_num_sent sentences holding target tokens (max_target, or with probability short_seq_prob a
    length in [2, max_target]); see csrc/helpers.cpp. Whole epochs are added until max_num_samples
    rows exist (at most num_epochs; an epoch with no row stops it), then the rows are shuffled.
    Random numbers: splitmix64 from `seed`. int32 rows, int64 when sentence ids pass int32.
    """
    doc_starts = np.ascontiguousarray(doc_starts, dtype=np.int64)
    doc_ends = np.ascontiguousarray(doc_ends, dtype=np.int64)
    sizes = np.ascontiguousarray(sizes, dtype=np.int32)
    use_int64 = len(sizes) > INT32_MAX
    args = (int(num_epochs), int(max_num_samples), int(max_target), float(short_seq_prob),
            int(seed) & _MASK64, int(min_num_sent))
    if _pick(impl) == "cpp":
        return helpers_cpp.build_mapping(doc_starts, doc_ends, sizes, *args, use_int64)
    return build_bert_mapping_numpy(doc_starts, doc_ends, sizes, *args,
                                    dtype=np.int64 if use_int64 else np.int32)


def build_bert_mapping_numpy(doc_starts, doc_ends, sizes, num_epochs, max_num_samples, max_target,
                             short_seq_prob, seed, min_num_sent, dtype=np.int32):
    """The reference: the C++ loop in Python (the document filter in numpy)."""
    if max_target < 2 or min_num_sent < 1 or num_epochs < 1:
        raise ValueError("max_target must be >= 2, min_num_sent and num_epochs >= 1")
    if len(doc_starts) != len(doc_ends):
        raise ValueError("doc_starts and doc_ends differ in length")
    if len(doc_starts) and ((doc_starts < 0).any() or (doc_ends < doc_starts).any() or doc_ends.max() > len(sizes)):
        raise IndexError("a document's sentence range lies outside sizes")
    usable = [d for d in range(len(doc_starts)) if doc_ends[d] - doc_starts[d] >= min_num_sent
              and sizes[doc_starts[d]:doc_ends[d]].max() <= max_target]
    sizes = sizes.tolist()
    rng, rows = SplitMix64(seed), []
    for _ in range(num_epochs):
        if len(rows) >= max_num_samples:
            break
        before = len(rows)
        for d in usable:
            first, last = int(doc_starts[d]), int(doc_ends[d])
            target = _bert_target(rng, short_seq_prob, max_target)
            run_start, run_tokens = first, 0
            for s in range(first, last):
                run_tokens += sizes[s]
                remaining = last - s - 1
                if (run_tokens >= target and s + 1 - run_start >= min_num_sent and remaining >= min_num_sent) \
                        or remaining == 0:
                    rows.append((run_start, s + 1, target))
                    run_start, run_tokens = s + 1, 0
                    target = _bert_target(rng, short_seq_prob, max_target)
        if len(rows) == before:
            break
    for i in range(len(rows) - 1, 0, -1):
        j = rng.below(i + 1)
        rows[i], rows[j] = rows[j], rows[i]
    return np.array(rows, dtype=dtype).reshape(-1, 3)
