"""Data semantics as Megatron-LM has them, with hand-computed expectations: --split boundaries,
blend sizes and order, the validation walk and the test set, empty documents, GPT-2's literal eod."""
from types import SimpleNamespace

import numpy as np
import pytest

from megatron.core.datasets import GPTDataset, GPTDatasetConfig, IndexedDataset, build_gpt_datasets, helpers
from megatron.core.datasets.blended_dataset import BlendedDataset
from megatron.core.datasets.builder import component_sizes, parse_split, split_ranges
from megatron.training.data.loader import end_of_training_sets, sample_counts, validation_window
from megatron.training.data.preprocess import encode_document
from megatron.training.tokenizer import gpt2_bpe
from megatron.training.tokenizer.base import TokenizerError
from megatron.training.tokenizer.simple import ByteTokenizer
from tests.data_utils import make_gpt2_files, run_tool, write_jsonl
from tests.unit.test_gpt_dataset import make_data


@pytest.mark.parametrize("split, n, want", [
    # round(running sum x N): 0.969 x 12345 = 11962.305, 0.999 x 12345 = 12332.655
    ("969,30,1", 12345, [(0, 11962), (11962, 12333), (12333, 12345)]),  # the old rule ended train at 11963
    ("969,30,1", 1, [(0, 1), (1, 1), (1, 1)]),
    ("969,30,1", 2, [(0, 2), (2, 2), (2, 2)]),
    ("969,30,1", 3, [(0, 3), (3, 3), (3, 3)]),
    ("969,30,1", 10, [(0, 10), (10, 10), (10, 10)]),
    ("969,30,1", 100, [(0, 97), (97, 100), (100, 100)]),
    ("8,1,1", 10, [(0, 8), (8, 9), (9, 10)]),
    ("1,1,1", 3, [(0, 1), (1, 2), (2, 3)]),
    ("1,1,1", 2, [(0, 1), (1, 1), (1, 2)]),  # 0.667 -> 1, 1.333 -> 1 (the old rule: (0,0),(0,1),(1,2))
    ("1,1,1", 1, [(0, 0), (0, 1), (1, 1)]),
    ("1,1,0", 5, [(0, 2), (2, 5), (5, 5)]),  # round(2.5) = 2: half to even
    ("1,1,0", 7, [(0, 4), (4, 7), (7, 7)]),  # round(3.5) = 4
    ("98,2,0", 100, [(0, 98), (98, 100), (100, 100)]),
    ("99,1,0", 12345, [(0, 12222), (12222, 12345), (12345, 12345)]),
])
def test_split_boundaries_round_the_running_sum(split, n, want):
    assert split_ranges(parse_split(split), n) == want


def test_greedy_blend_order_by_hand():
    # sample i goes to the largest weight x max(i, 1) - taken; e.g. i = 2: 1.0 - 1, 0.6 - 1, 0.4 - 0 -> dataset 2
    dataset_index, sample_index = helpers.build_blending_indices([0.5, 0.3, 0.2], 10, impl="numpy")
    assert dataset_index.tolist() == [0, 1, 2, 0, 1, 0, 2, 0, 1, 0]
    assert sample_index.tolist() == [0, 0, 0, 1, 1, 2, 1, 3, 2, 4]
    tijdeman, _ = helpers.build_blending_indices([0.5, 0.3, 0.2], 10, impl="numpy", order="tijdeman")
    assert tijdeman.tolist() == [0, 1, 0, 2, 0, 1, 0, 2, 1, 0]
    with pytest.raises(ValueError, match="blend order"):
        helpers.build_blending_indices([0.5, 0.5], 4, order="random")


@pytest.mark.skipif(helpers.helpers_cpp is None, reason="the C++ helper is not built")
@pytest.mark.parametrize("seed", range(6))
def test_greedy_order_cpp_equals_numpy(seed):
    rng = np.random.default_rng(seed)
    w = rng.random(int(rng.integers(1, 9))) ** 3 + 1e-3
    w /= w.sum()
    size = int(rng.integers(1, 3000))
    ref = helpers.build_blending_indices(w, size, impl="numpy")
    got = helpers.build_blending_indices(w, size, impl="cpp")
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])


def test_component_sizes_by_hand():
    # n = 10: ceil(10 w) = 5, 3, 2 drawn (blend length 10); built for ceil(5.025), ceil(3.015), ceil(2.01)
    assert component_sizes([0.5, 0.3, 0.2], 10, surplus=0.0) == [5, 3, 2]
    assert component_sizes([0.5, 0.3, 0.2], 10) == [6, 4, 3]
    # n = 7: ceil(3.5), ceil(2.1), ceil(1.4): the blend is 9 long, longer than asked, as Megatron-Core's
    assert component_sizes([0.5, 0.3, 0.2], 7, surplus=0.0) == [4, 3, 2]
    assert component_sizes([0.5, 0.3, 0.2], 7) == [5, 4, 3]


def test_blends_are_sized_as_megatron(tmp_path):
    a = make_data(tmp_path / "a", n_docs=60, seed=1, low=0, high=500)
    b = make_data(tmp_path / "b", n_docs=90, seed=2, low=600, high=1000)
    cfg = GPTDatasetConfig(seq_length=16, seed=3)
    train, _, _ = build_gpt_datasets(cfg, (1000, 0, 0), data_path=["3", a, "7", b], split="1,0,0")
    assert isinstance(train, BlendedDataset) and len(train) == 1000 and train.order == "megatron"
    assert [d.num_samples for d in train.datasets] == [302, 704]  # ceil(300 x 1.005), ceil(700 x 1.005)
    assert np.bincount(train.dataset_index).tolist() == [300, 700]
    want = helpers.build_blending_indices([0.3, 0.7], 1000, impl="numpy")[0]
    assert np.array_equal(train.dataset_index, want)

    # unweighted: weights are the datasets' one-epoch sample counts; the blend is at most their sum
    epoch = [len(GPTDataset(IndexedDataset(p), np.arange(n), 0, "train", cfg)) for p, n in ((a, 60), (b, 90))]
    small, _, _ = build_gpt_datasets(cfg, (100, 0, 0), data_path=[a, b], split="1,0,0")
    assert [len(d) for d in small.datasets] == epoch and len(small) == 100
    assert np.allclose(small.weights, np.array(epoch) / sum(epoch))
    whole, _, _ = build_gpt_datasets(cfg, (10 ** 6, 0, 0), data_path=[a, b], split="1,0,0")
    assert len(whole) == sum(epoch)

    # one prefix with a weight is still a blend (Megatron-Core only short-cuts an unweighted one)
    one, _, _ = build_gpt_datasets(cfg, (50, 0, 0), data_path=["1", a], split="1,0,0")
    plain, _, _ = build_gpt_datasets(cfg, (50, 0, 0), data_path=[a], split="1,0,0")
    assert isinstance(one, BlendedDataset) and one.datasets[0].num_samples == 51 and isinstance(plain, GPTDataset)
    tij, _, _ = build_gpt_datasets(cfg, (1000, 0, 0), data_path=["3", a, "7", b], split="1,0,0",
                                   blend_order="tijdeman")
    assert tij.order == "tijdeman" and not np.array_equal(tij.dataset_index, train.dataset_index)


def _cfg(**kw):
    base = dict(train_iters=10, eval_interval=4, eval_iters=2, global_batch_size=8, skip_train=False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_sample_counts_as_megatron():
    assert sample_counts(_cfg()) == (80, (10 // 4 + 1) * 2 * 8, 16)  # 3 evaluations of 2 batches of 8
    assert sample_counts(_cfg(train_iters=8)) == (64, 48, 16)
    assert sample_counts(_cfg(skip_train=True)) == (80, 16, 16)
    assert sample_counts(_cfg(eval_iters=0)) == (80, 0, 0)


def test_validation_walks_forward_and_resumes_from_the_iteration():
    t, data = _cfg(), list(range(48))
    first = [validation_window(data, it, t)[0] for it in (4, 8)]
    assert first == [0, 16]  # evaluation j reads global batches [(j-1) x 2, j x 2): samples 0.., 16..
    sets = end_of_training_sets((None, data, ["t0"]), 10, t)
    assert [name for name, _ in sets] == ["validation", "test"]
    assert sets[0][1][0] == 32 and sets[1][1][0] == "t0"  # the end reads the third window; test from 0
    eight = _cfg(train_iters=8)
    assert validation_window(data, 8, eight)[0] == 16 and end_of_training_sets((None, data, None), 8, eight)[0][1][0] \
        == 32  # evaluated twice at a final multiple of --eval-interval, as Megatron-LM
    assert end_of_training_sets((None, data, None), 6, t) == []  # stopped early (--exit-interval): none
    assert end_of_training_sets((None, data, None), 10, _cfg(eval_iters=0)) == []
    skip = end_of_training_sets((None, data, None), 7, _cfg(skip_train=True))
    assert [(name, ds[0]) for name, ds in skip] == [("validation", 0)]


def test_empty_document_has_no_sequence_and_no_eod(tmp_path):
    tok = ByteTokenizer()
    ids, lengths = encode_document(tok, b'{"text": ""}', ["text"], append_eod=True)["text"]
    assert ids.tolist() == [] and lengths == []
    for eod in ([], ["--append-eod"]):
        jsonl = write_jsonl(tmp_path / "docs.jsonl", ["ab", "", "c"])
        prefix = tmp_path / f"out{len(eod)}"
        proc = run_tool("preprocess_data.py", ["--input", jsonl, "--output-prefix", prefix, "--tokenizer-type",
                                               "ByteTokenizer", *eod])
        assert proc.returncode == 0, proc.stderr[-2000:]
        ds = IndexedDataset(f"{prefix}_text_document")
        end = [tok.eod] if eod else []
        assert ds.num_documents == 3 and len(ds) == 2 and ds.document_indices.tolist() == [0, 1, 1, 2]
        assert [ds.document(d).tolist() for d in range(3)] == [[97, 98] + end, [], [99] + end]


def test_gpt2_literal_endoftext_is_the_eod_id(tmp_path, monkeypatch):
    vocab, merges = make_gpt2_files(tmp_path, ["some text to train a few merges on, twice: some text"])
    tok = gpt2_bpe.GPT2BPETokenizer(vocab, merges)
    ids = tok.tokenize("some<|endoftext|> text<|endoftext|>")
    assert ids == tok.tokenize("some") + [tok.eod] + tok.tokenize(" text") + [tok.eod]
    assert tok.tokenize("<|endoftext|") == tok.tokenize("<|") + tok.tokenize("endoftext|")  # not the token
    try:
        from transformers import GPT2TokenizerFast
    except ImportError:
        GPT2TokenizerFast = None
    if GPT2TokenizerFast is not None:  # Megatron-LM's GPT2BPETokenizer is this class over the same files
        hf = GPT2TokenizerFast(vocab, merges)
        for text in ["a<|endoftext|>b", " <|endoftext|>\n\nnext", "x<|endoftext|><|endoftext|> y "]:
            assert tok.tokenize(text) == hf(text).input_ids
    monkeypatch.setattr(gpt2_bpe, "regex", None)
    with pytest.raises(TokenizerError, match="needs the `regex` package"):
        gpt2_bpe.GPT2BPETokenizer(vocab, merges)
