"""Datasets: GPT samples are dicts with 'tokens' = seq_length + 1 int64 ids; BERT samples are
described in bert_dataset.py.

indexed_dataset / indexed_builder: Megatron's .bin/.idx format (read, write); gpt_dataset:
packing documents into samples; bert_dataset / bert_sample: sentence pairs with masking;
blended_dataset: weighted mixtures; builder: --data-path and --split to train/valid/test;
helpers: index building (C++ with a numpy reference).
No module here imports torch at import time (collate_bert does when called).
"""
from .bert_dataset import BertDataset, BertDatasetConfig, collate_bert
from .blended_dataset import BlendedDataset
from .builder import build_bert_datasets, build_gpt_datasets, parse_blend, parse_split, split_ranges
from .gpt_dataset import GPTDataset, GPTDatasetConfig
from .index_cache import default_cache_root
from .indexed_builder import IndexedDatasetBuilder
from .indexed_dataset import DatasetError, IndexedDataset, optimal_dtype
from .mock_dataset import MockBertDataset, MockGPTDataset, mock_bert_special_ids
