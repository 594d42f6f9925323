"""BlendedDataset: samples drawn from several datasets in proportion to weights.

Sample i is sample dataset_sample_index[i] of dataset dataset_index[i]; the two arrays come
from helpers.build_blending_indices (Megatron-LM's greedy order by default, Tijdeman's with
--blend-order tijdeman) and are cached like the GPT indices. Each dataset's samples are taken in
its own (shuffled) order, so a dataset is asked for exactly as many samples as it serves.
"""
import numpy as np

from . import helpers
from .index_cache import INDEX_FORMAT, build_or_load


def blending_indices(weights, size, cache_dir, order="megatron"):
    """(dataset_index int16 [size], dataset_sample_index int64 [size]) for normalised weights."""
    description = {"class": "BlendedDataset", "format": INDEX_FORMAT, "weights": [float(w) for w in weights],
                   "size": int(size), "order": order}

    def build():
        d, s = helpers.build_blending_indices(weights, size, order=order)
        return {"dataset_index": d, "dataset_sample_index": s}

    arrays, _, _ = build_or_load(cache_dir, "BlendedDataset", description,
                                 ["dataset_index", "dataset_sample_index"], build)
    return arrays["dataset_index"], arrays["dataset_sample_index"]


class BlendedDataset:
    """datasets: list; sample i -> datasets[k][n] plus "dataset_id": k. order: how the
    indices were built ("megatron" or "tijdeman")."""

    def __init__(self, datasets, weights, dataset_index, dataset_sample_index, order="megatron"):
        self.datasets, self.weights, self.order = datasets, weights, order
        self.dataset_index, self.dataset_sample_index = dataset_index, dataset_sample_index

    def __len__(self):
        return len(self.dataset_index)

    def __getitem__(self, idx):
        k = int(self.dataset_index[idx])
        sample = dict(self.datasets[k][int(self.dataset_sample_index[idx])])
        sample["dataset_id"] = k
        return sample

    def shares(self):
        """Fraction of the blend drawn from each dataset: [datasets]."""
        return np.bincount(self.dataset_index, minlength=len(self.datasets)) / max(len(self), 1)
