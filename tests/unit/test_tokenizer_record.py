"""The tokenizer record beside a dataset (megatron/core/datasets/tokenizer_record.py): what it holds,
when it matches the run's tokenizer, and how merging carries it."""
import types

import pytest

from megatron.core.datasets.indexed_dataset import DatasetError
from megatron.core.datasets.tokenizer_record import check_record, merged_record, read_record, write_record
from megatron.training.tokenizer import ByteTokenizer
from megatron.training.tokenizer.record import tokenizer_record


def _cfg(kind, model=None):
    return types.SimpleNamespace(tokenizer_type=kind, vocab_file=None, merge_file=None, tokenizer_model=model)


def _sized(n):
    return types.SimpleNamespace(vocab_size=n)


def test_record_holds_type_vocabulary_and_the_files_hash(tmp_path):
    byte = tokenizer_record(_cfg("ByteTokenizer"), ByteTokenizer())
    assert byte == {"tokenizer_type": "ByteTokenizer", "vocab_size": 257, "files_sha256": None, "files": []}
    (tmp_path / "a.model").write_bytes(b"model one")
    (tmp_path / "b.model").write_bytes(b"model two")
    one = tokenizer_record(_cfg("GPTSentencePieceTokenizer", str(tmp_path / "a.model")), _sized(2000))
    assert one["tokenizer_type"] == "SentencePieceTokenizer"  # the alias is the same tokenizer
    assert one["files"] == ["a.model"] and len(one["files_sha256"]) == 64
    two = tokenizer_record(_cfg("SentencePieceTokenizer", str(tmp_path / "b.model")), _sized(2000))
    assert two["files_sha256"] != one["files_sha256"]
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "a.model").write_bytes(b"model one")  # moved, same bytes: the same record
    moved = tokenizer_record(_cfg("SentencePieceTokenizer", str(tmp_path / "copy" / "a.model")), _sized(2000))
    assert moved == one


def test_check_compares_type_vocabulary_and_hash_and_passes_data_without_a_record(tmp_path):
    prefix = str(tmp_path / "data")
    byte = {"tokenizer_type": "ByteTokenizer", "vocab_size": 257, "files_sha256": None, "files": []}
    check_record(prefix, byte)  # no record: Megatron-LM's data, read as before
    write_record(prefix, byte)
    assert read_record(prefix) == byte
    check_record(prefix, dict(byte, files=["renamed"]))  # names are not compared
    check_record(prefix, None)
    for other in (dict(byte, tokenizer_type="SentencePieceTokenizer", vocab_size=2000),
                  dict(byte, vocab_size=258), dict(byte, files_sha256="0" * 64)):
        with pytest.raises(DatasetError, match="the data was tokenized with ByteTokenizer .vocabulary 257"):
            check_record(prefix, other)
    (tmp_path / "data.tokenizer.json").write_text("{not json")
    with pytest.raises(DatasetError, match="unreadable tokenizer record"):
        check_record(prefix, byte)


def test_merge_carries_an_agreed_record_and_refuses_two_tokenizers(tmp_path):
    a, b, c = (str(tmp_path / n) for n in "abc")
    byte = {"tokenizer_type": "ByteTokenizer", "vocab_size": 257, "files_sha256": None, "files": []}
    write_record(a, byte)
    write_record(b, byte)
    assert merged_record([a, b]) == byte
    assert merged_record([a, c]) is None  # c has none: nothing can be said of the whole
    write_record(c, dict(byte, vocab_size=300))
    with pytest.raises(DatasetError, match=f"--input {a} was tokenized with ByteTokenizer"):
        merged_record([a, b, c])
