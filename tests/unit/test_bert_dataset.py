"""BERT data: the sentence-run mapping (C++ == numpy), pairs, masking, splits and errors, on real text.

The corpus is the Python standard library's docstrings: one document per paragraph, one sequence
per sentence (as preprocess_data.py --split-sentences writes them), word ids from a map built here.
"""
import importlib
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from megatron.core.datasets import (
    BertDataset,
    BertDatasetConfig,
    DatasetError,
    IndexedDataset,
    IndexedDatasetBuilder,
    MockBertDataset,
    build_bert_datasets,
    collate_bert,
    helpers,
    mock_bert_special_ids,
)
from megatron.training.data.loader import build_bert_datasets_from_config

needs_cpp = pytest.mark.skipif(helpers.helpers_cpp is None,
                               reason="C++ helpers not built (python setup.py build_ext --inplace)")

MODULES = ["argparse", "bisect", "calendar", "collections", "contextlib", "csv", "dataclasses", "datetime",
           "decimal", "difflib", "fractions", "functools", "heapq", "json", "logging", "pathlib", "random",
           "shlex", "shutil", "statistics", "string", "tarfile", "tempfile", "textwrap", "zipfile"]
PAD, CLS, SEP, MASK = 0, 1, 2, 3
FIRST_WORD = 4


def paragraphs():
    """Sentence lists of the stdlib's docstring paragraphs, without repeats."""
    seen = set()
    for name in MODULES:
        module = importlib.import_module(name)
        texts = [module.__doc__] + [getattr(getattr(module, a), "__doc__", None)
                                    for a in sorted(vars(module)) if not a.startswith("_")]
        for text in texts:
            for para in re.split(r"\n\s*\n", text if isinstance(text, str) else ""):
                flat = " ".join(para.split())
                if flat and flat not in seen:
                    seen.add(flat)
                    yield re.split(r"(?<=[.!?])\s+", flat)


class WordIds:
    """Lower-cased words and punctuation -> ids from FIRST_WORD on, in order of first sight."""

    def __init__(self):
        self.ids = {}

    def __call__(self, sentence):
        words = re.findall(r"\w+|[^\w\s]", sentence.lower())
        return [self.ids.setdefault(w, FIRST_WORD + len(self.ids)) for w in words]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(prefix, vocab_size, token lists per document) of a sentence-split indexed dataset."""
    prefix = str(tmp_path_factory.mktemp("bert") / "stdlib_sentences")
    words, docs = WordIds(), []
    builder = IndexedDatasetBuilder(prefix, np.uint16)
    for sentences in paragraphs():
        ids = [words(s) for s in sentences]
        for sentence in ids:
            builder.add_item(np.array(sentence, dtype=np.int64))
        builder.end_document()
        docs.append(ids)
    builder.finalize()
    return prefix, FIRST_WORD + len(words.ids), docs


def config(vocab, **kw):
    base = dict(seq_length=64, seed=1234, vocab_size=vocab, cls_id=CLS, sep_id=SEP, mask_id=MASK, pad_id=PAD)
    return BertDatasetConfig(**{**base, **kw})


def dataset(corpus, num_samples=400, **kw):
    prefix, vocab, _ = corpus
    ind = IndexedDataset(prefix)
    return BertDataset(ind, np.arange(ind.num_documents), num_samples, "train", config(vocab, **kw))


def unmasked(sample):
    """The sample's text with the original ids back where it was masked."""
    text = sample["text"].copy()
    where = sample["loss_mask"] > 0
    text[where] = sample["labels"][where]
    return text


def segments(sample):
    """(A, B) token arrays, read off types and the [SEP]s."""
    text, types, n = unmasked(sample), sample["types"], int(sample["padding_mask"].sum())
    a_end = int(np.flatnonzero(types[:n] == 0)[-1])  # A's [SEP]
    return text[1:a_end], text[a_end + 1:n - 1]


def find(sub, arr):
    """Start positions of sub as a contiguous run in arr."""
    sub, arr = np.asarray(sub), np.asarray(arr)
    if len(sub) == 0:
        return list(range(len(arr) + 1))
    if len(sub) > len(arr):
        return []
    windows = np.lib.stride_tricks.sliding_window_view(arr, len(sub))
    return np.flatnonzero((windows == sub).all(axis=1)).tolist()


# ---------------------------------------------------------------------------------------------- mapping

def random_documents(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, int(rng.choice([8, 30, 90])), int(rng.integers(1, 600))).astype(np.int32)
    cuts = np.sort(rng.integers(0, len(sizes) + 1, int(rng.integers(1, 80))))
    bounds = np.concatenate([[0], cuts, [len(sizes)]])
    return bounds[:-1], bounds[1:], sizes


@needs_cpp
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("epochs,max_samples,target,short,min_sent", [
    (1, 10 ** 9, 61, 0.0, 2), (1, 10 ** 9, 61, 0.1, 2), (3, 10 ** 9, 30, 0.5, 1), (1000, 150, 20, 0.1, 2),
    (2, 10 ** 9, 2, 1.0, 1)])
def test_mapping_cpp_equals_numpy(seed, epochs, max_samples, target, short, min_sent):
    starts, ends, sizes = random_documents(seed)
    args = (starts, ends, sizes, epochs, max_samples, target, short, seed * 7919 + 3, min_sent)
    cpp = helpers.build_bert_mapping(*args, impl="cpp")
    ref = helpers.build_bert_mapping(*args, impl="numpy")
    assert cpp.dtype == ref.dtype == np.int32
    np.testing.assert_array_equal(cpp, ref)


@needs_cpp
def test_mapping_cpp_equals_numpy_on_the_corpus(corpus):
    ind = IndexedDataset(corpus[0])
    di = ind.document_indices
    for args in [(4, 10 ** 9, 125, 0.1, 99, 2), (1, 10 ** 9, 30, 0.3, 5, 1)]:
        cpp = helpers.build_bert_mapping(di[:-1], di[1:], ind.sequence_lengths, *args, impl="cpp")
        np.testing.assert_array_equal(cpp, helpers.build_bert_mapping(di[:-1], di[1:], ind.sequence_lengths,
                                                                      *args, impl="numpy"))


@pytest.mark.parametrize("min_sent", [1, 2])
def test_mapping_rows_are_runs_of_whole_usable_documents(min_sent):
    starts, ends, sizes = random_documents(3)
    target, epochs = 40, 3
    rows = helpers.build_bert_mapping(starts, ends, sizes, epochs, 10 ** 9, target, 0.2, 11, min_sent, impl="numpy")
    usable = [(s, e) for s, e in zip(starts, ends) if e - s >= min_sent and sizes[s:e].max() <= target]
    covered = np.zeros(len(sizes), dtype=int)
    for first, end, t in rows:
        doc = int(np.searchsorted(starts, first, side="right")) - 1
        while ends[doc] == starts[doc]:  # empty documents share a start with the next one
            doc += 1
        assert (starts[doc], ends[doc]) in usable and end <= ends[doc]
        assert end - first >= min_sent and 2 <= t <= target
        if end < ends[doc]:  # a run closes early only once it holds its target
            assert sizes[first:end].sum() >= t
        covered[first:end] += 1
    want = np.zeros(len(sizes), dtype=int)
    for s, e in usable:
        want[s:e] = epochs
    np.testing.assert_array_equal(covered, want)  # every usable sentence once per epoch, nothing else


def test_mapping_stops_at_whole_epochs_past_max_samples():
    starts, ends, sizes = random_documents(5)
    one = len(helpers.build_bert_mapping(starts, ends, sizes, 1, 10 ** 9, 20, 0.0, 1, 1, impl="numpy"))
    capped = helpers.build_bert_mapping(starts, ends, sizes, 10 ** 6, one + 1, 20, 0.0, 1, 1, impl="numpy")
    assert len(capped) == 2 * one  # short targets off: every epoch cuts the same runs
    assert len(helpers.build_bert_mapping([0], [1], [50], 10 ** 6, 10, 20, 0.0, 1, 1, impl="numpy")) == 0


def test_short_seq_prob_sets_the_share_of_short_targets(corpus):
    for prob in (0.0, 0.1, 0.5):
        ds = dataset(corpus, 3000, short_seq_prob=prob)
        targets = ds.mapping[:, 2]
        assert targets.max() <= 61
        share = float((targets < 61).mean())
        # a short draw can equal 61 (1 in 60) and runs under a short target are shorter, so more of them
        assert (share == 0.0) if prob == 0.0 else prob * 0.8 < share < prob * 2.0, (prob, share)
    lengths = [int(dataset(corpus, 1000, short_seq_prob=p)[i]["padding_mask"].sum())
               for p in (0.0, 0.5) for i in range(300)]
    assert np.mean(lengths[300:]) < np.mean(lengths[:300]) - 5


# ---------------------------------------------------------------------------------------------- samples

def test_samples_have_the_documented_layout(corpus):
    ds = dataset(corpus)
    assert len(ds) >= 400
    for i in range(200):
        s = ds[i]
        assert set(s) == {"text", "types", "labels", "loss_mask", "padding_mask", "is_random"}
        for key in ("text", "types", "labels", "padding_mask"):
            assert s[key].dtype == np.int64 and s[key].shape == (64,)
        assert s["loss_mask"].dtype == np.float32 and s["is_random"].dtype == np.int64 and s["is_random"].shape == ()
        n = int(s["padding_mask"].sum())
        assert (s["padding_mask"][:n] == 1).all() and (s["text"][n:] == PAD).all() and (s["types"][n:] == 0).all()
        assert n - 3 <= ds.mapping[i, 2]  # the pair is cut to its target
        text = unmasked(s)
        assert text[0] == CLS and text[n - 1] == SEP and list(np.flatnonzero(text[:n] == SEP)[:-1]) != []
        a_sep = int(np.flatnonzero(s["types"][:n] == 0)[-1])
        assert text[a_sep] == SEP and (s["types"][a_sep + 1:n] == 1).all() and (s["types"][:a_sep + 1] == 0).all()


def test_masking_statistics(corpus):
    ds = dataset(corpus, 2000)
    chosen = candidates = masked = randomized = kept = 0
    for i in range(2000):
        s = ds[i]
        n = int(s["padding_mask"].sum())
        special = np.zeros(64, dtype=bool)
        special[0], special[n - 1] = True, True
        special[int(np.flatnonzero(s["types"][:n] == 0)[-1])] = True
        where = s["loss_mask"] > 0
        assert not where[special].any() and not where[n:].any()  # specials and padding never chosen
        assert (s["labels"][~where] == 0).all() and (s["labels"][where] >= FIRST_WORD).all()
        k = n - 3
        assert where.sum() == max(1, round(0.15 * k))
        chosen += int(where.sum())
        candidates += k
        text, label = s["text"][where], s["labels"][where]
        masked += int((text == MASK).sum())
        kept += int((text == label).sum())
        randomized += int(((text != MASK) & (text != label)).sum())
        assert ((text == MASK) | (text >= FIRST_WORD)).all()  # a random id is never a special one
    assert abs(chosen / candidates - 0.15) < 0.01
    assert abs(masked / chosen - 0.8) < 0.02
    # a random draw may hit the original id (1 in ~vocab): counted as kept
    assert abs(randomized / chosen - 0.1) < 0.015 and abs(kept / chosen - 0.1) < 0.015


def test_sop_pairs_are_consecutive_sentences_swapped_half_the_time(corpus):
    prefix, _, _ = corpus
    ind = IndexedDataset(prefix)
    ds = dataset(corpus, 1000)
    swapped = 0
    for i in range(1000):
        s = ds[i]
        first, end, _ = ds.mapping[i]
        run = np.concatenate([ind[j] for j in range(first, end)]).astype(np.int64)
        a, b = segments(s)
        assert len(a) and len(b)
        if s["is_random"]:
            a, b = b, a
            swapped += 1
        assert any(pa + len(a) <= pb for pa in find(a, run) for pb in find(b, run)), i
    assert abs(swapped / 1000 - 0.5) < 0.05


def test_nsp_takes_b_from_another_document(corpus):
    prefix, _, docs = corpus
    ind = IndexedDataset(prefix)
    ds = dataset(corpus, 600, binary_head_task="nsp")
    streams = [np.concatenate([np.array(x, dtype=np.int64) for x in d]) for d in docs]
    rand = 0
    for i in range(600):
        s = ds[i]
        first, end, _ = ds.mapping[i]
        own = int(np.searchsorted(ind.document_indices, first, side="right")) - 1
        run = np.concatenate([ind[j] for j in range(first, end)]).astype(np.int64)
        a, b = segments(s)
        assert find(a, run)
        if s["is_random"]:
            rand += 1
            assert any(find(b, streams[d]) for d in range(len(streams)) if d != own), i
        else:
            assert any(pa + len(a) <= pb for pa in find(a, run) for pb in find(b, run)), i
    assert abs(rand / 600 - 0.5) < 0.07


def test_without_binary_head_one_segment(corpus):
    ds = dataset(corpus, 300, binary_head=False)
    assert ds.mapping[:, 2].max() <= 62
    single = 0
    for i in range(300):
        s = ds[i]
        n = int(s["padding_mask"].sum())
        text = unmasked(s)
        assert text[0] == CLS and text[n - 1] == SEP and (text[1:n - 1] != SEP).all()
        assert (s["types"] == 0).all() and s["is_random"] == 0
        single += int(ds.mapping[i, 1] - ds.mapping[i, 0] == 1)
    assert single > 0  # one-sentence runs and documents are used without the pair task


def test_same_index_same_sample_and_the_mapping_is_cached(corpus, tmp_path):
    a = dataset(corpus, cache_dir=str(tmp_path))
    b = dataset(corpus, cache_dir=str(tmp_path))
    assert a.built and not b.built and a.cache_key == b.cache_key
    np.testing.assert_array_equal(a.mapping, b.mapping)
    for i in (0, 7, 399):
        for key in a[i]:
            np.testing.assert_array_equal(a[i][key], b[i][key])
    other = dataset(corpus, seed=99)
    assert not all(np.array_equal(a[i]["text"], other[i]["text"]) for i in range(5))


def test_collate_bert_and_blends(corpus):
    prefix, vocab, _ = corpus
    train, valid, test = build_bert_datasets(config(vocab), (300, 50, 0), data_path=["0.5", prefix, "0.5", prefix],
                                             split="90,10,0")
    assert test is None
    batch = collate_bert([train[i] for i in range(4)], "cpu")
    want = {"tokens": torch.int64, "types": torch.int64, "labels": torch.int64, "loss_mask": torch.float32,
            "padding_mask": torch.bool, "is_random": torch.int64}
    assert {k: v.dtype for k, v in batch.items()} == want
    assert batch["tokens"].shape == (4, 64) and batch["is_random"].shape == (4,)
    assert len(valid) == 50


def test_build_bert_datasets_splits_documents(corpus):
    prefix, vocab, _ = corpus
    ind = IndexedDataset(prefix)
    train, valid, _ = build_bert_datasets(config(vocab), (200, 20, 0), data_path=[prefix], split="80,20,0")
    n = ind.num_documents
    assert train.documents[0] == 0 and train.documents[-1] + 1 == valid.documents[0] and valid.documents[-1] == n - 1
    assert valid.mapping[:, 0].min() >= ind.document_indices[valid.documents[0]]


# ---------------------------------------------------------------------------------------------- errors

def write(prefix, docs):
    b = IndexedDatasetBuilder(str(prefix), np.uint16)
    for doc in docs:
        for sentence in doc:
            b.add_item(np.array(sentence))
        b.end_document()
    b.finalize()
    return str(prefix)


def test_errors_name_the_fix(corpus, tmp_path):
    _, vocab, docs = corpus
    flat = write(tmp_path / "flat", [[sum(d, [])] for d in docs[:50]])  # one sequence per document
    with pytest.raises(DatasetError, match="no document has 2 or more sentences: preprocess with --split-sentences"):
        build_bert_datasets(config(vocab), (10, 0, 0), data_path=[flat], split="1,0,0")
    assert build_bert_datasets(config(vocab, binary_head=False), (10, 0, 0), data_path=[flat], split="1,0,0")[0]
    long = write(tmp_path / "long", [[[5] * 70, [6] * 3]] * 4)
    with pytest.raises(DatasetError, match="longer than 61 tokens .*--seq-length 64"):
        build_bert_datasets(config(vocab), (10, 0, 0), data_path=[long], split="1,0,0")
    with pytest.raises(DatasetError, match="gives the valid split of .* no documents"):
        build_bert_datasets(config(vocab, binary_head=False), (10, 5, 0), data_path=[flat], split="1,0,0")
    with pytest.raises(DatasetError, match="not found"):
        build_bert_datasets(config(vocab), (10, 0, 0), data_path=[str(tmp_path / "missing")])
    with open(flat + ".bin", "r+b") as fh:
        fh.truncate(10)
    with pytest.raises(DatasetError, match="truncated"):
        build_bert_datasets(config(vocab), (10, 0, 0), data_path=[flat])
    small = dataset(corpus, 10)
    small.config = config(10)
    with pytest.raises(DatasetError, match="outside the tokenizer's vocabulary"):
        small[0]
    with pytest.raises(ValueError, match="binary_head_task"):
        config(vocab, binary_head_task="xyz")


# ---------------------------------------------------------------------------------------------- mock

def test_mock_bert_dataset_and_training_entry():
    ids = mock_bert_special_ids(1000)
    m = MockBertDataset(50, 32, 1000, seed=3)
    assert m.config.cls_id == ids["cls_id"] == 996 and m.config.pad_id == 999
    for i in range(50):
        s = m[i]
        n = int(s["padding_mask"].sum())
        assert s["text"][0] == ids["cls_id"] and s["text"][n - 1] == ids["sep_id"] and s["text"].shape == (32,)
        assert s["loss_mask"].sum() >= 1 and (unmasked(s)[1:n] < 996).sum() == n - 3
    np.testing.assert_array_equal(m[4]["text"], MockBertDataset(50, 32, 1000, seed=3)[4]["text"])
    train_cfg = SimpleNamespace(mock_data=True, train_iters=3, eval_iters=0, global_batch_size=4, seed=5,
                                eval_interval=10, skip_train=False)
    train, valid, _ = build_bert_datasets_from_config(train_cfg, SimpleNamespace(seq_length=16),
                                                   SimpleNamespace(vocab_size=128), True, "nsp", 0.15, 0.1)
    assert len(train) == 12 and collate_bert([train[0], valid[0]])["tokens"].shape == (2, 16)


def test_training_entry_reads_files_with_the_tokenizer_ids(corpus, tmp_path):
    prefix, vocab, _ = corpus
    train_cfg = SimpleNamespace(mock_data=False, train_iters=5, eval_iters=1, global_batch_size=8, seed=5,
                                data_path=[prefix], split="90,10,0", per_split_paths=[None, None, None],
                                data_cache_path=str(tmp_path), eval_interval=10, skip_train=False,
                                blend_order="megatron", tokenizer_type="BertWordPieceLowerCase",
                                mmap_bin_files=True)
    tokenizer = SimpleNamespace(vocab_size=vocab, cls=CLS, sep=SEP, mask=MASK, pad=PAD)
    train, valid, _ = build_bert_datasets_from_config(train_cfg, SimpleNamespace(seq_length=48), tokenizer,
                                                   True, "sop", 0.15, 0.1)
    assert len(train) >= 40 and len(valid) >= 8 and train.built
    assert train.config.max_target == 45 and train[0]["text"][0] == CLS
