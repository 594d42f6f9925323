"""Each tokenizer from real files made here; text -> preprocess_data.py -> reader gives its ids + eod."""
import filecmp
import types

import numpy as np
import pytest

from megatron.core.datasets import IndexedDataset
from megatron.training.tokenizer import TokenizerError, build_tokenizer
from tests.data_utils import (
    EDGE_CASES,
    make_gpt2_files,
    make_hf_tokenizer,
    make_sentencepiece,
    preprocess,
    sample_texts,
    write_jsonl,
)

try:
    import tokenizers  # noqa: F401
    HAVE_HF = True
except ImportError:
    HAVE_HF = False


def _cfg(kind, **kw):
    base = dict(tokenizer_type=kind, vocab_file=None, merge_file=None, tokenizer_model=None, null_vocab_size=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{tokenizer type: (config, CLI flags)} over small real tokenizer files, and the texts."""
    d = tmp_path_factory.mktemp("tok")
    texts = sample_texts(120_000)
    vocab, merges = make_gpt2_files(d, texts[:20] + EDGE_CASES)
    spm = make_sentencepiece(d, texts)
    out = {
        "GPT2BPETokenizer": {"vocab_file": vocab, "merge_file": merges},
        "SentencePieceTokenizer": {"tokenizer_model": spm},
        "ByteTokenizer": {},
    }
    if HAVE_HF:
        out["HuggingFaceTokenizer"] = {"tokenizer_model": make_hf_tokenizer(d, vocab, merges)}
    return d, texts, out


def _flags(kind, kw):
    names = {"vocab_file": "--vocab-file", "merge_file": "--merge-file", "tokenizer_model": "--tokenizer-model",
             "null_vocab_size": "--vocab-size"}
    return ["--tokenizer-type", kind] + [x for k, v in kw.items() for x in (names[k], str(v))]


@pytest.mark.parametrize("kind", ["GPT2BPETokenizer", "SentencePieceTokenizer", "HuggingFaceTokenizer",
                                  "ByteTokenizer", "NullTokenizer"])
def test_preprocess_round_trip_gives_the_tokenizer_ids(files, kind, tmp_path):
    folder, texts, all_kw = files
    if kind == "HuggingFaceTokenizer" and not HAVE_HF:
        pytest.skip("the optional `tokenizers` package is not installed")
    if kind == "NullTokenizer":
        kw = {"null_vocab_size": 5000}
        texts = [" ".join(str(i) for i in np.random.default_rng(n).integers(0, 5000, n)) for n in range(40)]
    else:
        kw = all_kw[kind]
        texts = texts[:30] + EDGE_CASES
    tok = build_tokenizer(_cfg(kind, **kw))
    prefix = preprocess(write_jsonl(tmp_path / "in.jsonl", texts), tmp_path / "out", _flags(kind, kw))
    ds = IndexedDataset(prefix)
    assert ds.dtype == np.uint16 and ds.num_documents == len(texts)
    for i, text in enumerate(texts):  # an empty text is an empty document: no sequence, no eod
        ids = list(tok.tokenize(text))
        assert ds.document(i).tolist() == (ids + [tok.eod] if ids else []), (kind, i, text[:80])
    if kind != "NullTokenizer":
        assert 0 <= tok.eod < tok.vocab_size
        for text in EDGE_CASES:  # every tokenizer here is lossless on text
            assert tok.detokenize(tok.tokenize(text)) == text, (kind, text)


def test_two_workers_and_partitions_write_the_same_bytes(files, tmp_path):
    folder, texts, all_kw = files
    jsonl = write_jsonl(tmp_path / "in.jsonl", texts[:60] * 3)
    flags = _flags("GPT2BPETokenizer", all_kw["GPT2BPETokenizer"])
    one = preprocess(jsonl, tmp_path / "w1", flags, "--workers", "1")
    for name, extra in (("w2", ["--workers", "2"]), ("p3", ["--workers", "2", "--partitions", "3"])):
        other = preprocess(jsonl, tmp_path / name, flags, *extra)
        for ext in (".bin", ".idx", ".tokenizer.json"):
            assert filecmp.cmp(one + ext, other + ext, shallow=False), (name, ext)
    assert sorted(p.name for p in tmp_path.iterdir() if "p3" in p.name) == \
        ["p3_text_document.bin", "p3_text_document.idx", "p3_text_document.tokenizer.json"]  # parts cleaned up


@pytest.mark.skipif(not HAVE_HF, reason="the optional `tokenizers` package is not installed")
def test_gpt2_bpe_matches_hugging_face_on_the_same_files(files):
    folder, texts, all_kw = files
    ours = build_tokenizer(_cfg("GPT2BPETokenizer", **all_kw["GPT2BPETokenizer"]))
    theirs = build_tokenizer(_cfg("HuggingFaceTokenizer", **all_kw["HuggingFaceTokenizer"]))
    for text in texts[20:40] + EDGE_CASES:  # texts the merges were not trained on, too
        assert ours.tokenize(text) == theirs.tokenize(text)
    assert ours.eod == theirs.eod and ours.vocab_size == theirs.vocab_size
    from_folder = build_tokenizer(_cfg("HuggingFaceTokenizer", tokenizer_model=str(folder)))
    assert from_folder.tokenize(EDGE_CASES[2]) == ours.tokenize(EDGE_CASES[2])


def test_bad_tokenizer_files_are_clear_errors(files, tmp_path):
    folder, _, all_kw = files
    gpt2 = all_kw["GPT2BPETokenizer"]
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "merges.txt").write_text("#version: 0.2\nzz qq\n")
    (tmp_path / "junk.model").write_bytes(b"\x00junk")
    cases = [
        (_cfg("GPT2BPETokenizer", vocab_file=gpt2["vocab_file"]), "needs --merge-file"),
        (_cfg("GPT2BPETokenizer", vocab_file=str(tmp_path / "bad.json"), merge_file=gpt2["merge_file"]),
         "is not a JSON vocabulary"),
        (_cfg("GPT2BPETokenizer", vocab_file=gpt2["vocab_file"], merge_file=str(tmp_path / "merges.txt")),
         "merges.txt line 2: merge result 'zzqq' is not in the vocabulary"),
        (_cfg("SentencePieceTokenizer", tokenizer_model=str(tmp_path / "none.model")), "no such file"),
        (_cfg("SentencePieceTokenizer", tokenizer_model=str(tmp_path / "junk.model")), "is not a SentencePiece model"),
        (_cfg("HuggingFaceTokenizer", tokenizer_model=str(tmp_path)), "no tokenizer.json there"),
        (_cfg("NullTokenizer"), "needs --vocab-size"),
    ]
    for cfg, expected in cases:
        with pytest.raises(TokenizerError, match=None) as info:
            build_tokenizer(cfg)
        assert expected in str(info.value), (expected, str(info.value))
