"""Datasets: samples are dicts with 'tokens' = seq_length + 1 int64 ids.

indexed_dataset / indexed_builder: Megatron's .bin/.idx format (read, write); gpt_dataset:
packing documents into samples; blended_dataset: weighted mixtures; builder: --data-path and
--split to train/valid/test; helpers: index building (C++ with a numpy reference).
No module here imports torch.
"""
from .blended_dataset import BlendedDataset
from .builder import build_gpt_datasets, parse_blend, parse_split, split_ranges
from .gpt_dataset import GPTDataset, GPTDatasetConfig
from .index_cache import default_cache_root
from .indexed_builder import IndexedDatasetBuilder
from .indexed_dataset import DatasetError, IndexedDataset, optimal_dtype
from .mock_dataset import MockGPTDataset
