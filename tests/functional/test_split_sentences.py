"""preprocess_data.py --split-sentences: one sequence per sentence, documents grouping their
sentences in the .idx."""
import filecmp

from megatron.core.datasets import IndexedDataset
from megatron.training.tokenizer import BertWordPieceTokenizer, build_wordpiece_vocab, write_vocab
from tests.data_utils import run_tool, write_jsonl
from tools.sentence_splitter import split_sentences

DOCS = ["Alpha beta. Gamma delta! Epsilon?", "One sentence only", "",
        "Mr. Brown went home. He slept.\nNew line here. Café crème. 日本語。テスト",
        "   ", "Last doc. With U.S. acronym. And 3.14 numbers. End."]


def _preprocess(tmp_path, tokenizer_args, *extra, name="out"):
    jsonl = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    proc = run_tool("preprocess_data.py", ["--input", jsonl, "--output-prefix", tmp_path / name,
                                           "--split-sentences", *tokenizer_args, *extra])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{tmp_path / name}_text_sentence" in proc.stdout
    return IndexedDataset(str(tmp_path / f"{name}_text_sentence"))


def _documents(ds):
    d = ds.document_indices
    return [[ds[i].tolist() for i in range(d[k], d[k + 1])] for k in range(ds.num_documents)]


def test_sentences_are_sequences_and_documents_group_them(tmp_path):
    expected = [split_sentences(t) for t in DOCS]  # empty documents are kept, with no sequence
    ds = _preprocess(tmp_path, ["--tokenizer-type", "ByteTokenizer"])
    assert ds.num_documents == len(expected) == 6 and len(ds) == sum(map(len, expected))
    assert [[bytes(s).decode() for s in doc] for doc in _documents(ds)] == expected

    split = _preprocess(tmp_path, ["--tokenizer-type", "ByteTokenizer"], "--append-eod", "--workers", "2",
                        "--partitions", "2", name="eod")
    for doc, sentences in zip(_documents(split), expected):  # eod ends each document's last sentence only
        assert [s[-1] == 256 for s in doc] == ([False] * (len(doc) - 1) + [True] if doc else [])
        assert [bytes(s[:-1] if s[-1] == 256 else s).decode() for s in doc] == sentences


def test_bert_wordpiece_sentences_with_workers_match_one_worker(tmp_path):
    vocab = write_vocab(build_wordpiece_vocab(DOCS, 200, lower_case=True), tmp_path / "vocab.txt")
    tok = BertWordPieceTokenizer(vocab)
    args = ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", vocab, "--append-eod"]
    ds = _preprocess(tmp_path, args, name="one")
    _preprocess(tmp_path, args, "--workers", "2", name="two")
    for suffix in (".bin", ".idx"):
        assert filecmp.cmp(tmp_path / f"one_text_sentence{suffix}", tmp_path / f"two_text_sentence{suffix}", False)
    expected = [[tok.tokenize(s) for s in split_sentences(t)] for t in DOCS]
    for doc in filter(None, expected):
        doc[-1].append(tok.sep)
    assert _documents(ds) == expected


def test_keep_newlines_needs_split_sentences(tmp_path):
    jsonl = write_jsonl(tmp_path / "d.jsonl", DOCS)
    proc = run_tool("preprocess_data.py", ["--input", jsonl, "--output-prefix", tmp_path / "x", "--keep-newlines",
                                           "--tokenizer-type", "ByteTokenizer"])
    assert proc.returncode == 2 and "--keep-newlines goes with --split-sentences" in proc.stderr
