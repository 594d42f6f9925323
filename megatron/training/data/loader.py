"""Datasets from the configuration, and global batches sliced over data-parallel ranks and microbatches.

Iteration k uses samples [c, c + G) of the dataset (c = samples consumed so far,
G = global batch). Validation walks forward as Megatron-LM's does (validation_window); the test
set is read once, from its start, after training. They are cut into chunks of micro x DP; DP rank r takes slice
[r x micro, (r+1) x micro) of each chunk. Which samples form a global batch therefore
never depends on the layout; the datasets themselves are built the same on every rank.
"""
import functools
import os

import numpy as np
import torch

from ...core.datasets import (
    BertDatasetConfig,
    GPTDatasetConfig,
    MockBertDataset,
    MockGPTDataset,
    build_bert_datasets,
    build_gpt_datasets,
    default_cache_root,
)
from ...core.datasets.gpt_masks import EodOptions, ltor_masks
from ...core.transformer.context_parallel import batch_on_this_cp_rank
from ..tokenizer.record import tokenizer_record


def index_cache_dir(train_cfg):
    return os.path.join(train_cfg.data_cache_path or default_cache_root(), "index-cache")


def build_datasets(train_cfg, model_cfg, tokenizer):
    """(train, valid, test) datasets for the configured source; valid and test are None with
    --eval-iters 0, test also when there is no test data (no --test-data-path, or --split gives
    the test split no documents).

    Raises DatasetError (one line) for missing, corrupt or too small data.
    """
    t, s = train_cfg, model_cfg.seq_length
    counts = sample_counts(t)
    if t.mock_data:
        return _mock(lambda n, seed: MockGPTDataset(n, s, tokenizer.vocab_size, seed, tokenizer.eod,
                                                    t.mock_document_length), t, counts)
    config = GPTDatasetConfig(seq_length=s, seed=t.seed, cache_dir=index_cache_dir(t),
                              vocab_size=tokenizer.vocab_size, tokenizer=tokenizer_record(t, tokenizer),
                              mmap_bin_files=t.mmap_bin_files)
    return _from_files(build_gpt_datasets, config, t, counts)


def sample_counts(train_cfg):
    """(train, valid, test) samples, as Megatron-LM sizes them: train_iters x G; validation
    (train_iters // eval_interval + 1) x eval_iters x G (one window per evaluation in training,
    one at its end; eval_iters x G with --skip-train); test eval_iters x G (G: global batch)."""
    g = train_cfg.global_batch_size
    during = train_cfg.train_iters // train_cfg.eval_interval if train_cfg.eval_interval else 0
    evaluations = 1 if train_cfg.skip_train else during + 1
    return train_cfg.train_iters * g, evaluations * train_cfg.eval_iters * g, train_cfg.eval_iters * g


def _mock(make, train_cfg, counts):
    """(train, valid, test) synthetic datasets (seeds seed, seed + 1, seed + 2); test None without
    --eval-iters."""
    train, valid, test = counts
    seed = train_cfg.seed
    return make(train, seed), make(max(1, valid), seed + 1), make(test, seed + 2) if test else None


def _from_files(build, config, train_cfg, counts):
    """(train, valid, test) from files with build (build_gpt_datasets or build_bert_datasets), one
    sample of each read now so that a tokenizer mismatch fails before training."""
    per_split = train_cfg.per_split_paths if any(train_cfg.per_split_paths) else None
    datasets = tuple(build(config, counts, data_path=train_cfg.data_path, split=train_cfg.split, per_split=per_split,
                           blend_order=train_cfg.blend_order))
    for ds in datasets:
        if ds is not None:
            ds[0]
    return datasets


class _Window:
    """dataset seen from sample `offset` on (wrapping): sample i -> dataset[(offset + i) % len]."""

    def __init__(self, dataset, offset):
        self.dataset, self.offset = dataset, offset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[(self.offset + i) % len(self.dataset)]


def validation_window(dataset, iteration, train_cfg, at_end=False):
    """The validation samples the evaluation at `iteration` reads, walking forward as Megatron-LM:
    the j-th evaluation in training (iteration j x eval_interval) reads global batches
    [(j - 1) x eval_iters, j x eval_iters), the one at the end of training the next eval_iters,
    with --skip-train the first. The position follows from the iteration alone (as Megatron-LM
    derives consumed_valid_samples), so a resumed run keeps walking where it stopped."""
    if train_cfg.skip_train or not train_cfg.eval_interval:
        done = 0
    else:
        done = iteration // train_cfg.eval_interval - (0 if at_end else 1)
    return _Window(dataset, done * train_cfg.eval_iters * train_cfg.global_batch_size)


def end_of_training_sets(datasets, iteration, train_cfg):
    """[(split, dataset)] evaluated once after training, as Megatron-LM: the validation set's next
    window, then the test set from its start; none after an early exit (--exit-interval, SIGTERM)."""
    _, valid, test = datasets
    if train_cfg.eval_iters == 0 or not (train_cfg.skip_train or iteration >= train_cfg.train_iters):
        return []
    sets = [("validation", validation_window(valid, iteration, train_cfg, at_end=True))] if valid is not None else []
    return sets + ([("test", test)] if test is not None else [])


def build_bert_datasets_from_config(train_cfg, model_cfg, tokenizer, binary_head=True, binary_head_task="sop",
                                    masked_lm_prob=0.15, short_seq_prob=0.1):
    """(train, valid, test) BERT datasets, as build_datasets.

    The special ids come from the tokenizer (cls, sep, mask, pad, vocab_size), except with
    --mock-data, whose synthetic samples use their own at the top of the vocabulary
    (mock_bert_special_ids), so a NullTokenizer works.
    """
    t, s = train_cfg, model_cfg.seq_length
    counts = sample_counts(t)
    options = {"masked_lm_prob": masked_lm_prob, "short_seq_prob": short_seq_prob, "binary_head": binary_head,
               "binary_head_task": binary_head_task}
    if t.mock_data:
        return _mock(lambda n, seed: MockBertDataset(n, s, tokenizer.vocab_size, seed, **options), t, counts)
    config = BertDatasetConfig(seq_length=s, seed=t.seed, cache_dir=index_cache_dir(t),
                               vocab_size=tokenizer.vocab_size, cls_id=tokenizer.cls, sep_id=tokenizer.sep,
                               mask_id=tokenizer.mask, pad_id=tokenizer.pad, tokenizer=tokenizer_record(t, tokenizer),
                               mmap_bin_files=t.mmap_bin_files, **options)
    return _from_files(build_bert_datasets, config, t, counts)


def describe_datasets(datasets):
    """One line per dataset for the start-up log."""
    lines = []
    for name, ds in zip(("train", "valid", "test"), datasets):
        if ds is None:
            lines += ["> test: none (no test data: no --test-data-path, or no test documents in --split)"] \
                if name == "test" and datasets[1] is not None else []
            continue
        parts = getattr(ds, "datasets", None)
        if parts is None:
            lines.append(f"> {name}: {_describe(ds)}")
            continue
        order = "" if ds.order == "megatron" else f", {ds.order} order (--blend-order {ds.order})"
        lines.append(f"> {name}: blend of {len(parts)} datasets, {len(ds)} samples{order}")
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


def collate_gpt(samples, device, eod_options=None):
    """GPT samples (tokens [s + 1]) -> tokens [b, s], labels [b, s], loss_mask [b, s] (fp32); with
    eod_options (an EodOptions: --eod-mask-loss, --reset-*) also position_ids [b, s] and the
    documents' segment_ids [b, s] where reset (core/datasets/gpt_masks.py; no [s, s] mask)."""
    t = torch.from_numpy(np.stack([x["tokens"] for x in samples])).to(device)
    batch = {"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous(),
             "loss_mask": torch.ones(t[:, 1:].shape, dtype=torch.float32, device=device)}
    if eod_options is not None:
        batch["loss_mask"], positions, segments = ltor_masks(batch["tokens"], eod_options)
        batch.update({k: v for k, v in (("position_ids", positions), ("segment_ids", segments)) if v is not None})
    return batch


def gpt_collate(train_cfg, tokenizer):
    """The collate of --eod-mask-loss / --reset-position-ids / --reset-attention-mask, or None
    (collate_gpt's plain batches and the model's causal fast path) when none is given."""
    t = train_cfg
    if not (t.eod_mask_loss or t.reset_position_ids or t.document_masking()):
        return None
    opts = EodOptions(tokenizer.eod, t.eod_mask_loss, t.reset_position_ids, t.document_masking())
    return functools.partial(collate_gpt, eod_options=opts)


def microbatches(dataset, consumed, global_batch, micro, dp_rank, dp_size, device, collate=None, cp=None):
    """This DP rank's microbatches of the global batch starting at sample `consumed`.

    Each is collate(samples, device) (default collate_gpt: tokens, labels, loss_mask); with cp
    (a context_parallel.CPSlice) only this CP rank's part of each sequence (batch_on_this_cp_rank).
    """
    collate = collate or collate_gpt
    out = []
    for start in range(consumed, consumed + global_batch, micro * dp_size):
        first = start + dp_rank * micro
        batch = collate([dataset[i % len(dataset)] for i in range(first, first + micro)], device)
        out.append(batch if cp is None else batch_on_this_cp_rank(batch, cp))
    return out
