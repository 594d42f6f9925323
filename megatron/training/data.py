"""Datasets from the configuration, and global batches sliced over data-parallel ranks and microbatches.

Iteration k uses samples [c, c + G) of the dataset (c = samples consumed so far,
G = global batch). They are cut into chunks of micro x DP; DP rank r takes slice
[r x micro, (r+1) x micro) of each chunk. Which samples form a global batch therefore
never depends on the layout; the datasets themselves are built the same on every rank.
"""
import os

import numpy as np
import torch

from ..core.datasets import (
    BertDatasetConfig,
    GPTDatasetConfig,
    MockBertDataset,
    MockGPTDataset,
    build_bert_datasets,
    build_gpt_datasets,
    default_cache_root,
)


def index_cache_dir(train_cfg):
    return os.path.join(train_cfg.data_cache_path or default_cache_root(), "index-cache")


def build_datasets(train_cfg, model_cfg, tokenizer):
    """(train, valid) datasets for the configured source; valid is None with --eval-iters 0.

    Raises DatasetError (one line) for missing, corrupt or too small data.
    """
    t, s = train_cfg, model_cfg.seq_length
    num_train, num_valid = _sample_counts(t)
    if t.mock_data:
        return (MockGPTDataset(num_train, s, tokenizer.vocab_size, t.seed, tokenizer.eod),
                MockGPTDataset(max(1, num_valid), s, tokenizer.vocab_size, t.seed + 1, tokenizer.eod))
    config = GPTDatasetConfig(seq_length=s, seed=t.seed, cache_dir=index_cache_dir(t),
                              vocab_size=tokenizer.vocab_size)
    return _train_and_valid(build_gpt_datasets, config, t, num_train, num_valid)


def _sample_counts(t):
    """(train, valid) samples the run reads; evaluation re-reads the first eval_iters batches."""
    return t.train_iters * t.global_batch_size, t.eval_iters * t.global_batch_size


def _train_and_valid(build, config, t, num_train, num_valid):
    """(train, valid) from files with build (build_gpt_datasets or build_bert_datasets), one sample of
    each read now so that a tokenizer mismatch fails before training."""
    per_split = t.per_split_paths if any(t.per_split_paths) else None
    train, valid, _ = build(config, (num_train, num_valid, 0), data_path=t.data_path, split=t.split,
                            per_split=per_split)
    for ds in (train, valid):
        if ds is not None:
            ds[0]
    return train, valid


def build_bert_datasets_from_config(train_cfg, model_cfg, tokenizer, binary_head=True, binary_head_task="sop",
                                    masked_lm_prob=0.15, short_seq_prob=0.1):
    """(train, valid) BERT datasets, as build_datasets; valid is None with --eval-iters 0.

    The special ids come from the tokenizer (cls, sep, mask, pad, vocab_size), except with
    --mock-data, whose synthetic samples use their own at the top of the vocabulary
    (mock_bert_special_ids), so a NullTokenizer works.
    """
    t, s = train_cfg, model_cfg.seq_length
    num_train, num_valid = _sample_counts(t)
    options = {"masked_lm_prob": masked_lm_prob, "short_seq_prob": short_seq_prob, "binary_head": binary_head,
               "binary_head_task": binary_head_task}
    if t.mock_data:
        return (MockBertDataset(num_train, s, tokenizer.vocab_size, t.seed, **options),
                MockBertDataset(max(1, num_valid), s, tokenizer.vocab_size, t.seed + 1, **options))
    config = BertDatasetConfig(seq_length=s, seed=t.seed, cache_dir=index_cache_dir(t),
                               vocab_size=tokenizer.vocab_size, cls_id=tokenizer.cls, sep_id=tokenizer.sep,
                               mask_id=tokenizer.mask, pad_id=tokenizer.pad, **options)
    return _train_and_valid(build_bert_datasets, config, t, num_train, num_valid)


def describe_datasets(datasets):
    """One line per dataset for the start-up log."""
    lines = []
    for name, ds in zip(("train", "valid"), datasets):
        if ds is None:
            continue
        parts = getattr(ds, "datasets", None)
        if parts is None:
            lines.append(f"> {name}: {_describe(ds)}")
            continue
        lines.append(f"> {name}: blend of {len(parts)} datasets, {len(ds)} samples")
        for w, share, part in zip(ds.weights, ds.shares(), parts):
            lines.append(f">    weight {w:.3f} (drawn {share:.3f}): {_describe(part) if part else 'not drawn'}")
    return lines


def _describe(ds):
    if not hasattr(ds, "indexed"):
        return f"{type(ds).__name__}, {len(ds)} samples"
    if hasattr(ds, "mapping"):  # BertDataset: epochs are whole, so the rows are the story
        return (f"{ds.indexed.path_prefix}: {len(ds.documents)} documents, {len(ds)} sentence-run samples "
                f"({ds.num_samples} asked), mapping {'built' if ds.built else 'loaded from cache'} "
                f"({ds.cache_key[:10]})")
    return (f"{ds.indexed.path_prefix}: {len(ds.documents)} documents, {ds.tokens_per_epoch} tokens per epoch, "
            f"{ds.num_epochs()} epoch(s), {ds.num_samples} samples asked, index "
            f"{'built' if ds.built else 'loaded from cache'} ({ds.cache_key[:10]})")


def collate_gpt(samples, device):
    """GPT samples (tokens [s + 1]) -> tokens [b, s], labels [b, s], loss_mask [b, s] (fp32)."""
    t = torch.from_numpy(np.stack([x["tokens"] for x in samples])).to(device)
    return {"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous(),
            "loss_mask": torch.ones(t[:, 1:].shape, dtype=torch.float32, device=device)}


def microbatches(dataset, consumed, global_batch, micro, dp_rank, dp_size, device, collate=None):
    """This DP rank's microbatches of the global batch starting at sample `consumed`.

    Each is collate(samples, device) (default collate_gpt: tokens, labels, loss_mask).
    """
    collate = collate or collate_gpt
    out = []
    for start in range(consumed, consumed + global_batch, micro * dp_size):
        first = start + dp_rank * micro
        out.append(collate([dataset[i % len(dataset)] for i in range(first, first + micro)], device))
    return out
