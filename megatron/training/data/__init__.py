"""Datasets from the configuration, global batches sliced over data-parallel ranks, the embedded
corpus and jsonl preprocessing."""
