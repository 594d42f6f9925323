"""GPTDataset packing, epochs, --split, blending, the index cache, and order independent of layout."""
import os
import shutil

import numpy as np
import pytest

from megatron.core.datasets import (
    DatasetError,
    GPTDataset,
    GPTDatasetConfig,
    IndexedDataset,
    build_gpt_datasets,
    split_ranges,
)
from megatron.training.data.loader import microbatches
from tests.data_utils import all_tokens, make_data


def test_samples_are_consecutive_windows_of_the_shuffled_documents(tmp_path):
    ind = IndexedDataset(make_data(tmp_path / "d"))
    docs = np.arange(10, 150)
    cfg = GPTDatasetConfig(seq_length=32, seed=5)
    ds = GPTDataset(ind, docs, 700, "train", cfg)  # more than one epoch
    tokens = ds.tokens_per_epoch
    assert ds.num_epochs() == -(-(700 * 32 + 1) // tokens) and ds.num_epochs() > 1
    assert sorted(ds.document_index.tolist()) == sorted(docs.tolist() * ds.num_epochs())
    stream = np.concatenate([ind[int(d)] for d in ds.document_index]).astype(np.int64)
    for i in range(len(ds.sample_index) - 1):  # sample i in served order is window shuffle_index[i]
        k = int(ds.shuffle_index[i])
        assert np.array_equal(ds[i]["tokens"], stream[k * 32: k * 32 + 33])
    assert sorted(ds.shuffle_index.tolist()) == list(range(len(ds)))
    assert len(ds) >= 700


def test_partial_last_epoch_is_shuffled_separately(tmp_path):
    ind = IndexedDataset(make_data(tmp_path / "d"))
    docs = np.arange(200)
    ds1 = GPTDataset(ind, docs, 10, "train", GPTDatasetConfig(seq_length=16, seed=1))
    per_epoch = len(ds1)
    ds = GPTDataset(ind, docs, per_epoch + 5, "train", GPTDatasetConfig(seq_length=16, seed=1))
    assert ds.num_epochs() == 2
    assert sorted(ds.document_index[:200].tolist()) == list(range(200))  # epoch 1 whole, then epoch 2
    first = ((ds.tokens_per_epoch - 1) // 16)
    assert sorted(ds.shuffle_index[:first].tolist()) == list(range(first))


def test_split_ranges_follow_megatron():
    assert split_ranges([0.969, 0.03, 0.001], 1000) == [(0, 969), (969, 999), (999, 1000)]
    assert split_ranges([0.5, 0.5, 0.0], 3) == [(0, 2), (2, 3), (3, 3)]  # round(1.5): half to even, on the running sum
    assert split_ranges([1, 0, 0], 7) == [(0, 7), (7, 7), (7, 7)]


def test_splits_are_disjoint_and_an_empty_asked_split_is_an_error(tmp_path):
    prefix = make_data(tmp_path / "d")
    cfg = GPTDatasetConfig(seq_length=16, seed=1)
    train, valid, test = build_gpt_datasets(cfg, (50, 20, 5), data_path=[prefix], split="80,15,5")
    assert (train.documents.min(), train.documents.max()) == (0, 159)
    assert (valid.documents.min(), valid.documents.max()) == (160, 189)
    assert (test.documents.min(), test.documents.max()) == (190, 199)
    with pytest.raises(DatasetError, match="gives the valid split of .* no documents .*--eval-iters"):
        build_gpt_datasets(cfg, (50, 20, 0), data_path=[prefix], split="100,0,0")
    assert build_gpt_datasets(cfg, (50, 0, 0), data_path=[prefix], split="100,0,0")[1] is None


def test_blend_draws_each_dataset_by_its_weight(tmp_path):
    a = make_data(tmp_path / "a", seed=1, low=0, high=500)        # tokens <= 500
    b = make_data(tmp_path / "b", seed=2, low=600, high=1000)     # tokens >= 600
    cfg = GPTDatasetConfig(seq_length=16, seed=3)
    train, _, _ = build_gpt_datasets(cfg, (1000, 0, 0), data_path=["0.3", a, "0.7", b], split="1,0,0",
                                     blend_order="tijdeman")
    taken = np.cumsum(np.eye(2)[train.dataset_index], axis=0)
    target = np.arange(1, 1001)[:, None] * np.array([0.3, 0.7])
    assert np.abs(taken - target).max() <= 0.5 + 1e-9  # two datasets: within half a sample, every prefix
    for i in range(0, 1000, 37):
        s = train[i]
        assert (s["tokens"] <= 500).all() if s["dataset_id"] == 0 else (s["tokens"] >= 600).all()
    assert np.bincount(train.dataset_index).tolist() == [300, 700]
    assert [d.num_samples for d in train.datasets] == [302, 704]  # Megatron-Core's 0.5% surplus


def test_per_split_paths_use_each_dataset_whole(tmp_path):
    a = make_data(tmp_path / "a", n_docs=50, seed=1, low=0, high=500)
    b = make_data(tmp_path / "b", n_docs=30, seed=2, low=600, high=1000)
    cfg = GPTDatasetConfig(seq_length=16, seed=3)
    train, valid, test = build_gpt_datasets(cfg, (40, 10, 0), per_split=[[a], ["1", b + ".bin"], None])
    assert len(train.documents) == 50 and len(valid.documents) == 30 and test is None
    assert (all_tokens(valid, 10) >= 600).all() and (all_tokens(train, 40) <= 500).all()
    with pytest.raises(DatasetError, match="10 valid samples are needed .* no --valid-data-path"):
        build_gpt_datasets(cfg, (40, 10, 0), per_split=[[a], None, None])


def test_cache_is_reused_by_content_not_path(tmp_path):
    prefix = make_data(tmp_path / "d")
    cache = str(tmp_path / "cache")
    cfg = GPTDatasetConfig(seq_length=16, seed=1, cache_dir=cache)
    first = GPTDataset(IndexedDataset(prefix), np.arange(200), 300, "train", cfg)
    assert first.built and len(os.listdir(cache)) > 3
    moved = str(tmp_path / "moved")
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, moved + ext)
    again = GPTDataset(IndexedDataset(moved), np.arange(200), 300, "train", cfg)
    assert not again.built and again.cache_key == first.cache_key
    fresh = GPTDataset(IndexedDataset(prefix), np.arange(200), 300, "train", GPTDatasetConfig(16, 1))
    assert np.array_equal(all_tokens(again, 300), all_tokens(fresh, 300))
    other = make_data(tmp_path / "o", seed=9)
    assert GPTDataset(IndexedDataset(other), np.arange(200), 300, "train", cfg).cache_key != first.cache_key


def test_global_batch_does_not_depend_on_dp_size(tmp_path):
    ds = GPTDataset(IndexedDataset(make_data(tmp_path / "d")), np.arange(200), 64, "train",
                    GPTDatasetConfig(seq_length=16, seed=2))
    import torch
    batches = {}
    for dp, micro in ((1, 8), (2, 2), (4, 1), (8, 1)):
        rows = {}
        for r in range(dp):
            for k, mb in enumerate(microbatches(ds, 16, 16, micro, r, dp, torch.device("cpu"))):
                for m in range(micro):  # sample position within the global batch
                    rows[k * micro * dp + r * micro + m] = mb["tokens"][m]
        batches[dp] = torch.stack([rows[i] for i in range(16)])
    for dp in (2, 4, 8):
        assert torch.equal(batches[dp], batches[1])
