"""From --data-path / --split (or --train/valid/test-data-path) to train, valid and test datasets.

    --data-path PREFIX                     one dataset, split by documents with --split
    --data-path 0.3 PREFIX_A 0.7 PREFIX_B  a blend: each split blends the datasets' same split
    --data-path PREFIX_A PREFIX_B          a blend weighted by each dataset's samples in one epoch
                                           of the split (and at most their sum long)
    --train-data-path ... --valid-data-path ... --test-data-path ...   one blend per split, unsplit

--split 969,30,1 gives each split a contiguous range of documents, as Megatron-Core does:
boundary i is the rounded running sum of the normalised fractions times the document count.
A weighted blend of n samples is sum(ceil(n x w)) long, and each dataset is built for
ceil(ceil(n x w) x 1.005) samples (Megatron-Core's 0.5% surplus); see docs/data.md.
"""
import math
import os
import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .bert_dataset import BertDataset
from .blended_dataset import BlendedDataset, blending_indices
from .gpt_dataset import GPTDataset
from .indexed_dataset import DatasetError, IndexedDataset, normalize_prefix
from .token_range import check_token_ids
from .tokenizer_record import check_record

SPLITS = ("train", "valid", "test")
_ASKED_BY = {"train": "--train-iters", "valid": "--eval-iters", "test": "--eval-iters"}
MID_LEVEL_SURPLUS = 0.005  # Megatron-Core's --mid-level-dataset-surplus default


def parse_blend(items, flag="--data-path"):
    """['A'] | ['A', 'B'] | ['0.3', 'A', '0.7', 'B'] -> (prefixes, weights or None)."""
    if not items:
        return None
    items = [str(x) for x in items]
    _check_pairs(items, flag)
    weights, prefixes = None, items
    if len(items) % 2 == 0:
        parsed = [_float_or_none(x) for x in items[0::2]]
        if all(w is not None for w in parsed):
            weights, prefixes = parsed, items[1::2]
        elif any(w is not None for w in parsed) and len(items) > 2:
            raise DatasetError(f"{flag} mixes weights and paths; give either 'W1 PATH1 W2 PATH2 ...' "
                               "or 'PATH1 PATH2 ...'")
    if weights is not None and not all(math.isfinite(w) and w > 0 for w in weights):
        raise DatasetError(f"{flag} weights must be positive numbers, got {weights}")
    return [normalize_prefix(p) for p in prefixes], weights


def _check_pairs(items, flag):
    """An odd count with a number among the items is a blend missing a weight or a path (not a
    dataset named '0.5'): say so instead of 'not found'."""
    if len(items) % 2 and len(items) > 1 and any(
            _float_or_none(x) is not None and not os.path.exists(x + ".idx") for x in items):
        raise DatasetError(f"{flag} has {len(items)} items, but a weighted blend is pairs 'W1 PATH1 W2 PATH2 ...': "
                           "a weight or a path is missing")


def _float_or_none(text):
    try:
        return float(text)
    except ValueError:
        return None


def parse_split(text):
    """'969,30,1' -> three fractions summing to 1. Megatron-LM reads the numbers out of the text, so these
    mean the same: "'99,1,0'" (quotes a shell kept), '99 1 0', '99,1,0,' (trailing comma), '98/2/0', '1'."""
    pieces = [x for x in re.split(r"[,/\s]+", str(text).strip().strip("'\"")) if x]
    try:
        parts = [float(x) for x in pieces]
    except ValueError:
        raise DatasetError(f"--split {text!r} must be up to three numbers like 969,30,1") from None
    if not 1 <= len(parts) <= 3 or any(p < 0 or not math.isfinite(p) for p in parts) or sum(parts) <= 0:
        raise DatasetError(f"--split {text!r} must be up to three non-negative numbers with a positive sum")
    parts += [0.0] * (3 - len(parts))
    return [p / sum(parts) for p in parts]


def split_ranges(fractions, num_documents):
    """Megatron-Core's document boundaries: [(start, stop)] for train, valid, test.

    Boundary i is round(running sum of the first i fractions x N), Python's round (half to even),
    as Megatron-Core's builder rounds each book-end of its split matrix.
    """
    bounds, total = [0], 0.0
    for f in fractions:
        total += f
        bounds.append(int(round(total * float(num_documents))))
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


class _Kind(NamedTuple):
    """What differs between GPT and BERT data for the builder."""
    dataset: Callable   # (indexed, documents, num_samples, split, config) -> dataset
    documents: Callable  # indexed -> how many documents --split divides
    one_epoch: int      # num_samples that builds exactly one epoch (an unweighted blend's components)


_GPT = _Kind(GPTDataset, len, 0)
_BERT = _Kind(BertDataset, lambda ds: ds.num_documents, 1)  # BERT adds whole epochs until >= 1 row


def build_gpt_datasets(config, num_samples, data_path=None, split="969,30,1", per_split=None, blend_order="megatron"):
    """[train, valid, test] datasets (None where num_samples is 0, or for a test split with no data).

    config: GPTDatasetConfig; num_samples: 3 sample counts; data_path: a --data-path list;
    per_split: 3 lists (--train/valid/test-data-path), used whole, instead of data_path;
    blend_order: "megatron" (greedy) or "tijdeman" (see helpers.build_blending_indices).
    """
    return _build_datasets(_GPT, config, num_samples, data_path, split, per_split, blend_order)


def build_bert_datasets(config, num_samples, data_path=None, split="969,30,1", per_split=None,
                        blend_order="megatron"):
    """[train, valid, test] BertDatasets, as build_gpt_datasets.

    config: BertDatasetConfig. --split divides each dataset's documents (lists of sentences).
    """
    return _build_datasets(_BERT, config, num_samples, data_path, split, per_split, blend_order)


def _build_datasets(kind, config, num_samples, data_path, split, per_split, blend_order):
    opened = {}

    def open_ds(prefix):
        if prefix not in opened:
            opened[prefix] = IndexedDataset(prefix, mmap=config.mmap_bin_files)
            # before any sample is read: ids past the vocabulary (the concrete message), then the record
            check_token_ids(opened[prefix], config.vocab_size, config.cache_dir)
            check_record(prefix, config.tokenizer)
        return opened[prefix]

    out = []
    for i, name in enumerate(SPLITS):
        n = int(num_samples[i])
        if n <= 0:
            out.append(None)
            continue
        if per_split is not None:
            blend = parse_blend(per_split[i], f"--{name}-data-path")
            if blend is None and name == "test":  # as Megatron: no test data, no test evaluation
                out.append(None)
                continue
            if blend is None:
                raise DatasetError(f"{n} {name} samples are needed ({_ASKED_BY[name]}) but no "
                                   f"--{name}-data-path was given")
            prefixes, weights = blend
            parts = [(open_ds(p), np.arange(kind.documents(open_ds(p)))) for p in prefixes]
            blended = len(parts) > 1  # Megatron-Core uses a lone per-split prefix as it is, weighted or not
        else:
            prefixes, weights = parse_blend(data_path)
            fractions = parse_split(split)
            parts = []
            for p in prefixes:
                count = kind.documents(open_ds(p))
                a, b = split_ranges(fractions, count)[i]
                parts.append((open_ds(p), np.arange(a, b)))
            if name == "test" and any(len(docs) == 0 for _, docs in parts):
                out.append(None)  # a small dataset's 0.1% test share is often empty: no test evaluation
                continue
            for p, (_, docs) in zip(prefixes, parts):
                if len(docs) == 0:
                    raise DatasetError(
                        f"--split {split} gives the {name} split of {p} no documents (it has "
                        f"{kind.documents(open_ds(p))}), but {n} {name} samples are needed ({_ASKED_BY[name]}); "
                        f"give the {name} split a share of --split"
                        f"{' or set --eval-iters 0' if name != 'train' else ''}")
            blended = len(parts) > 1 or weights is not None
        if not blended:
            ds, docs = parts[0]
            out.append(kind.dataset(ds, docs, n, name, config))
        else:
            out.append(_blend(kind, config, name, n, parts, weights, blend_order))
    return out


def component_sizes(weights, n, surplus=MID_LEVEL_SURPLUS):
    """Megatron-Core's samples per blended dataset: ceil(ceil(n x w) x (1 + surplus)) for
    normalised weights w; surplus 0 gives the samples the blend plans to draw (its length is their
    sum), the default 0.005 the samples each component dataset is built for."""
    return [int(math.ceil(math.ceil(n * w) * (1 + surplus))) for w in weights]


def _blend(kind, config, name, n, parts, weights, order):
    """A BlendedDataset of n samples (fewer for an unweighted blend whose datasets hold less) over
    parts [(indexed, documents)], as Megatron-Core's builder sizes it."""
    if weights is not None:
        weights = _normalize(weights)
        datasets = [kind.dataset(ds, docs, size, name, config)
                    for (ds, docs), size in zip(parts, component_sizes(weights, n))]
        size = sum(component_sizes(weights, n, surplus=0.0))
    else:  # weighted by each dataset's one-epoch sample count, at most their sum
        datasets = [kind.dataset(ds, docs, kind.one_epoch, name, config) for ds, docs in parts]
        weights = [len(d) for d in datasets]
        if not all(weights):
            empty = parts[weights.index(0)][0].path_prefix
            raise DatasetError(f"{empty}: its {name} split holds less than one sample, so it cannot weigh in an "
                               "unweighted blend; give weights ('W1 PATH1 W2 PATH2 ...') or leave it out")
        size = min(n, sum(weights))
    weights = _normalize(weights)
    dataset_index, dataset_sample_index = blending_indices(weights, size, config.cache_dir, order)
    for k, drawn in enumerate(np.bincount(dataset_index, minlength=len(datasets))):
        if drawn > len(datasets[k]):
            raise DatasetError(f"the {name} blend draws {drawn} samples from {datasets[k].indexed.path_prefix}, "
                               f"which has {len(datasets[k])}")
    return BlendedDataset(datasets, weights, dataset_index, dataset_sample_index, order)


def _normalize(weights):
    """Megatron-Core's normalize: float64 weights over their numpy sum, as Python floats."""
    w = np.array(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()
