"""TikTokenizer (Megatron-LM semantics) over a tiny hand-made vocabulary: ids, offsets, eod, the cut."""
import base64
import json
import sys
import types

import pytest

from megatron.training.tokenizer import TokenizerError, build_tokenizer

pytest.importorskip("tiktoken")

MERGES = [b"he", b"ll", b"hell", b"hello"]  # ranks 256..259


def write_vocab(path, tokens=None):
    """A Megatron-LM tiktoken vocabulary: the 256 bytes, then MERGES; returns the path as str."""
    tokens = [bytes([i]) for i in range(256)] + MERGES if tokens is None else tokens
    entries = [{"rank": r, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("latin-1")}
               for r, t in enumerate(tokens)]
    path.write_text(json.dumps(entries))
    return str(path)


@pytest.fixture
def vocab(tmp_path):
    return write_vocab(tmp_path / "vocab.json")


def _cfg(path, vocab_size=1260, **kw):
    base = dict(tokenizer_type="TikTokenizer", vocab_file=None, merge_file=None, tokenizer_model=path,
                null_vocab_size=vocab_size, tiktoken_pattern=None, tiktoken_num_special_tokens=1000,
                special_tokens=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_ids_are_ranks_after_the_special_ids(vocab):
    tok = build_tokenizer(_cfg(vocab))
    # "hello" merges he, ll -> hell -> hello (rank 259); " " is byte 32, "!" byte 33; each + 1000
    assert tok.tokenize("hello hello!") == [1259, 1032, 1259, 1033]
    assert tok.detokenize([1259, 1032, 1259, 1033]) == "hello hello!"
    assert (tok.vocab_size, tok.eod, tok.bos) == (1260, 2, 1)
    # a special token written in the text is that token's id, as Megatron-LM encodes
    assert tok.tokenize("he</s><SPECIAL_7>") == [1256, 2, 7]
    assert tok.detokenize([1256, 2, 7]) == "he</s><SPECIAL_7>"
    text = "Grüße, 世界 hello\n\n  tabs\tand 123"
    assert tok.detokenize(tok.tokenize(text)) == text


@pytest.mark.parametrize("pattern", ["v1", "v2"])
def test_both_split_patterns_round_trip(vocab, pattern):
    tok = build_tokenizer(_cfg(vocab, tiktoken_pattern=pattern))
    assert tok.tokenize("hello") == [1259]
    text = "Don't STOP 42 times!!\r\n ok"
    assert tok.detokenize(tok.tokenize(text)) == text


def test_vocab_size_cuts_the_file_and_special_tokens_set_eod(vocab):
    tok = build_tokenizer(_cfg(vocab, vocab_size=1258))  # keeps the bytes, he and ll
    assert tok.tokenize("hello") == [1256, 1257, 1000 + ord("o")]
    tok = build_tokenizer(_cfg(vocab, vocab_size=270, tiktoken_num_special_tokens=10,
                               special_tokens=["<pad>", "<unk>", "<s>", "<mask>", "</s>", "<cls>", "<sep>", "<x>"]))
    assert (tok.eod, tok.vocab_size, tok.tokenize("<x>hello")) == (4, 270, [7, 269])


def test_pickles_by_its_arguments(vocab):
    import pickle
    tok = pickle.loads(pickle.dumps(build_tokenizer(_cfg(vocab))))
    assert tok.tokenize("hello") == [1259]


def _error(cfg):
    with pytest.raises(TokenizerError) as e:
        build_tokenizer(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_bad_input_is_one_line(tmp_path, vocab, monkeypatch):
    assert "give --vocab-size 1260" in _error(_cfg(vocab, vocab_size=None))  # default 2**17 > file
    assert "no such file" in _error(_cfg(str(tmp_path / "missing.json")))
    (tmp_path / "bad.json").write_text("{not json")
    assert "not a readable JSON" in _error(_cfg(str(tmp_path / "bad.json")))
    swapped = [bytes([i]) for i in range(256)] + MERGES
    swapped[5], swapped[6] = swapped[6], swapped[5]
    assert "entry 5 must be the single byte 5" in _error(_cfg(write_vocab(tmp_path / "s.json", swapped)))
    (tmp_path / "r.json").write_text(json.dumps([{"rank": 3, "token_bytes": "AA==", "token_str": ""}] * 1260))
    assert "entry 0 must be" in _error(_cfg(str(tmp_path / "r.json")))
    assert "must include" in _error(_cfg(vocab, special_tokens=["<s>", "</s>"]))
    assert "fewer than the 7" in _error(_cfg(vocab, tiktoken_num_special_tokens=5))
    assert "choose v1 or v2" in _error(_cfg(vocab, tiktoken_pattern="v3"))
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    assert "pip install tiktoken" in _error(_cfg(vocab))

