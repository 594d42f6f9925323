"""From --data-path / --split (or --train/valid/test-data-path) to train, valid and test datasets.

    --data-path PREFIX                     one dataset, split by documents with --split
    --data-path 0.3 PREFIX_A 0.7 PREFIX_B  a blend: each split blends the datasets' same split
    --data-path PREFIX_A PREFIX_B          a blend weighted by the tokens of each split
    --train-data-path ... --valid-data-path ... --test-data-path ...   one blend per split, unsplit

--split 969,30,1 gives each split a contiguous range of documents, as Megatron-LM does:
boundary i is the rounded running sum of the normalised fractions times the document count.
"""
import math
import os
from typing import Callable, NamedTuple

import numpy as np

from .bert_dataset import BertDataset
from .blended_dataset import BlendedDataset, blending_indices
from .gpt_dataset import GPTDataset
from .indexed_dataset import DatasetError, IndexedDataset, normalize_prefix
from .token_range import check_token_ids

SPLITS = ("train", "valid", "test")
_ASKED_BY = {"train": "--train-iters", "valid": "--eval-iters", "test": "--eval-iters"}


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
    """'969,30,1' (or '98/2/0', or '1') -> three fractions summing to 1."""
    try:
        parts = [float(x) for x in str(text).replace("/", ",").split(",")]
    except ValueError:
        raise DatasetError(f"--split {text!r} must be up to three numbers like 969,30,1") from None
    if not 1 <= len(parts) <= 3 or any(p < 0 or not math.isfinite(p) for p in parts) or sum(parts) <= 0:
        raise DatasetError(f"--split {text!r} must be up to three non-negative numbers with a positive sum")
    parts += [0.0] * (3 - len(parts))
    return [p / sum(parts) for p in parts]


def split_ranges(fractions, num_documents):
    """Megatron-LM's document boundaries: [(start, stop)] for train, valid, test."""
    bounds = [0]
    for f in fractions:
        bounds.append(bounds[-1] + int(round(f * float(num_documents))))
    excess = bounds[-1] - num_documents
    bounds[1:] = [b - excess for b in bounds[1:]]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


class _Kind(NamedTuple):
    """What differs between GPT and BERT data for the builder."""
    dataset: Callable   # (indexed, documents, num_samples, split, config) -> dataset
    documents: Callable  # indexed -> how many documents --split divides
    tokens: Callable    # (indexed, ascending document range) -> its token count (blend weights)


def _sentence_tokens(ds, docs):
    """Tokens of an ascending range of BERT documents: lists of sentences (the .idx document
    index), not sequences as GPT's."""
    if len(docs) == 0:
        return 0
    first, end = ds.document_indices[docs[0]], ds.document_indices[docs[-1] + 1]
    return ds.sequence_lengths[first:end].sum(dtype=np.int64)


_GPT = _Kind(GPTDataset, len, lambda ds, docs: ds.sequence_lengths[docs].sum(dtype=np.int64))
_BERT = _Kind(BertDataset, lambda ds: ds.num_documents, _sentence_tokens)


def build_gpt_datasets(config, num_samples, data_path=None, split="969,30,1", per_split=None):
    """[train, valid, test] datasets (None where num_samples is 0).

    config: GPTDatasetConfig; num_samples: 3 sample counts; data_path: a --data-path list;
    per_split: 3 lists (--train/valid/test-data-path), used whole, instead of data_path.
    """
    return _build_datasets(_GPT, config, num_samples, data_path, split, per_split)


def build_bert_datasets(config, num_samples, data_path=None, split="969,30,1", per_split=None):
    """[train, valid, test] BertDatasets (None where num_samples is 0), as build_gpt_datasets.

    config: BertDatasetConfig. --split divides each dataset's documents (lists of sentences).
    """
    return _build_datasets(_BERT, config, num_samples, data_path, split, per_split)


def _build_datasets(kind, config, num_samples, data_path, split, per_split):
    opened = {}

    def open_ds(prefix):
        if prefix not in opened:
            opened[prefix] = IndexedDataset(prefix)
            check_token_ids(opened[prefix], config.vocab_size, config.cache_dir)  # before any sample is read
        return opened[prefix]

    out = []
    for i, name in enumerate(SPLITS):
        n = int(num_samples[i])
        if n <= 0:
            out.append(None)
            continue
        if per_split is not None:
            blend = parse_blend(per_split[i], f"--{name}-data-path")
            if blend is None:
                raise DatasetError(f"{n} {name} samples are needed ({_ASKED_BY[name]}) but no "
                                   f"--{name}-data-path was given")
            weights = blend[1] or [None] * len(blend[0])
            parts = [(p, w, np.arange(kind.documents(open_ds(p)))) for p, w in zip(blend[0], weights)]
        else:
            prefixes, weights = parse_blend(data_path)
            fractions = parse_split(split)
            parts = []
            for k, p in enumerate(prefixes):
                count = kind.documents(open_ds(p))
                a, b = split_ranges(fractions, count)[i]
                if a == b:
                    raise DatasetError(
                        f"--split {split} gives the {name} split of {p} no documents (it has "
                        f"{count}), but {n} {name} samples are needed ({_ASKED_BY[name]}); give the "
                        f"{name} split a share of --split{' or set --eval-iters 0' if name != 'train' else ''}")
                parts.append((p, weights[k] if weights else None, np.arange(a, b)))
        out.append(_blend_or_single(kind, config, name, n, [(open_ds(p), w, docs) for p, w, docs in parts]))
    return out


def _blend_or_single(kind, config, name, n, parts):
    if len(parts) == 1:
        ds, _, docs = parts[0]
        return kind.dataset(ds, docs, n, name, config)
    weights = [w for _, w, _ in parts]
    if weights[0] is None:  # unweighted: in proportion to each dataset's tokens in this split
        weights = [float(kind.tokens(ds, docs)) for ds, _, docs in parts]
    weights = np.array(weights, dtype=np.float64) / float(sum(weights))
    dataset_index, dataset_sample_index = blending_indices(weights, n, config.cache_dir)
    counts = np.bincount(dataset_index, minlength=len(parts))
    datasets = [kind.dataset(ds, docs, int(c), name, config) if c else None
                for (ds, _, docs), c in zip(parts, counts)]
    return BlendedDataset(datasets, weights, dataset_index, dataset_sample_index)
