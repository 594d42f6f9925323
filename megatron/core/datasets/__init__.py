"""Datasets: samples are dicts with 'tokens' = seq_length + 1 int64 ids."""
from .mock_dataset import MockGPTDataset
from .text_corpus import StdlibCorpusDataset
