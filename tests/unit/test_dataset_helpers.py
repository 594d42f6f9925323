"""The C++ index helpers equal their numpy references exactly; blending tracks the weights."""
import numpy as np
import pytest

from megatron.core.datasets import helpers
from megatron.core.datasets.gpt_dataset import _document_index

needs_cpp = pytest.mark.skipif(helpers.helpers_cpp is None,
                               reason="C++ helpers not built (pip install -e . or python setup.py build_ext --inplace)")


def random_case(seed):
    """Document sizes (some empty), a shuffled multi-epoch document index, a sequence length."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    sizes = rng.integers(0, int(rng.choice([5, 50, 2000])), n).astype(np.int32)
    sizes[rng.random(n) < 0.2] = 0
    if sizes.sum() < 2:
        sizes[0] = 2
    docs = np.arange(n, dtype=np.int32)[rng.random(n) < 0.9] if n > 3 else np.arange(n, dtype=np.int32)
    if sizes[docs].sum() < 2:
        docs = np.arange(n, dtype=np.int32)
    epochs = int(rng.integers(1, 5))
    doc_index = _document_index(docs, epochs, np.random.RandomState(seed))
    return sizes, doc_index, int(rng.integers(1, 300)), epochs, int(sizes[docs].sum())


def stream_windows(sizes, doc_index, seq_length, sample_idx):
    """Sample i read from the boundaries must be stream[i s : i s + s + 1] of the concatenated documents."""
    stream, starts = [], [0]
    for d in doc_index:
        stream.extend([int(d)] * int(sizes[d]))  # token = its document id: enough to check positions
        starts.append(starts[-1] + int(sizes[d]))
    for i in range(len(sample_idx) - 1):
        (j0, o0), (j1, o1) = sample_idx[i], sample_idx[i + 1]
        assert starts[j0] + o0 == (i * seq_length if i else 0)
        assert starts[j1] + o1 == (i + 1) * seq_length
        assert o1 < sizes[doc_index[j1]]  # a later boundary is a real token


@needs_cpp
@pytest.mark.parametrize("seed", range(40))
def test_sample_index_cpp_equals_numpy(seed):
    sizes, doc_index, s, epochs, tokens = random_case(seed)
    ref = helpers.build_sample_idx(sizes, doc_index, s, epochs, tokens, impl="numpy")
    got = helpers.build_sample_idx(sizes, doc_index, s, epochs, tokens, impl="cpp")
    assert got.dtype == ref.dtype == np.int32 and got.shape == ref.shape
    assert np.array_equal(got, ref)
    assert ref.shape[0] - 1 == (epochs * tokens - 1) // s


@pytest.mark.parametrize("seed", range(8))
def test_sample_index_boundaries_are_stream_positions(seed):
    sizes, doc_index, s, epochs, tokens = random_case(seed)
    idx = helpers.build_sample_idx(sizes, doc_index, s, epochs, tokens, impl="numpy")
    stream_windows(sizes, doc_index, s, idx)


@needs_cpp
def test_sample_index_rejects_inconsistent_input():
    sizes = np.array([3, 4], dtype=np.int32)
    with pytest.raises(IndexError):  # claims more tokens than the documents hold
        helpers.build_sample_idx(sizes, np.array([0, 1], dtype=np.int32), 2, 3, 7, impl="cpp")
    with pytest.raises(IndexError):
        helpers.build_sample_idx(sizes, np.array([0, 1], dtype=np.int32), 2, 3, 7, impl="numpy")


def shares_bound(weights, dataset_index):
    """Largest |taken_d(n) - w_d n| over every prefix n and dataset d."""
    k = len(weights)
    onehot = np.zeros((len(dataset_index), k))
    onehot[np.arange(len(dataset_index)), dataset_index] = 1
    n = np.arange(1, len(dataset_index) + 1)[:, None]
    return np.abs(np.cumsum(onehot, 0) - np.asarray(weights)[None, :] * n).max()


@pytest.mark.parametrize("seed", range(12))
def test_blending_cpp_equals_numpy_and_tracks_weights(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 9))
    w = rng.random(k) ** 3 + 1e-3
    w /= w.sum()
    size = int(rng.integers(1, 4000))
    ref = helpers.build_blending_indices(w, size, impl="numpy", order="tijdeman")
    if helpers.helpers_cpp is not None:
        got = helpers.build_blending_indices(w, size, impl="cpp", order="tijdeman")
        assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    dataset_index, sample_index = ref
    bound = 1 - 1 / (2 * k - 2) if k > 1 else 0
    assert shares_bound(w, dataset_index) <= bound + 1e-9 <= 1 + 1e-9  # within one sample, every prefix
    for d in range(k):  # each dataset's samples are taken in order 0, 1, 2, ...
        assert np.array_equal(sample_index[dataset_index == d], np.arange((dataset_index == d).sum()))


def test_megatron_style_two_way_blend():
    dataset_index, _ = helpers.build_blending_indices([0.3, 0.7], 10, impl="numpy", order="tijdeman")
    assert np.bincount(dataset_index).tolist() == [3, 7]
    assert shares_bound([0.3, 0.7], dataset_index) <= 0.5
