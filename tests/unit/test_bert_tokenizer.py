"""BertWordPieceTokenizer gives Hugging Face BertTokenizer's ids; the vocab builder; bad vocab files."""
import pickle
import types

import pytest

from megatron.training.tokenizer import (
    BertWordPieceTokenizer,
    TokenizerError,
    build_tokenizer,
    build_wordpiece_vocab,
    write_vocab,
)
from megatron.training.tokenizer.bert_wordpiece import split_words
from tests.data_utils import EDGE_CASES, run_tool, sample_texts, write_jsonl

TEXTS = EDGE_CASES + [
    "Hello World! HELLO world, hello WORLD.", "The U.S. economy grew 3.5% in Q2 (e.g. exports).",
    "Café naïve résumé façade Ångström Øresund straße ÉCOLE", "ΟΔΟΣ Σίσυφος İstanbul ǅ ﬁne",
    "中文分词测试，日本語のテキスト、한국어 텍스트 and 𠀀𪜀 mixed", "emoji 🙂🚀👨‍👩‍👧 ❤️ flags 🇫🇷 skin 👍🏽",
    "ctrl\x00chars\x07here\x1b[0m\x7f and \ufeffbom \u200bzero\u200dwidth soft\xadhyphen \ufffdreplacement",
    "tabs\tnew\nlines\r\nvertical\x0bform\x0cfeed nbsp\xa0thin\u2009ideo\u3000line\u2028para\u2029end",
    "x" * 99 + " " + "y" * 100 + " " + "z" * 101 + " " + "ab" * 300,
    "def f(x: int) -> dict[str, list]:\n    return {'a': [x ** 2, x // 3]}  # comment @decorator",
    "if (a && b || !c) { printf(\"%d\\n\", a->b[0]); } /* C */ $var ^ ~mask | `tick` <tag/>",
    "don't I'm we've they're it's ... ?! ,, ;; -- ―— «quoted» „low“ ¿qué? ¡sí!",
    "[MASK] [SEP] [CLS] [PAD] [UNK] literal special tokens, [mask] lower", "   ", "\n\n\t",
    "numbers 1,234,567.89 3.14e-10 0x1F 1st 2nd ½ ² ①", "Ａｂｃ full-width ＡＢＣ１２３ and ｶﾀｶﾅ",
]

HAND_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "Hello", "HELLO", "he", "##llo",
              "##l", "##o", "w", "##or", "##ld", "the", "u", "s", ".", ",", "!", "?", "(", ")", "[", "]", "mask",
              "sep", "cafe", "café", "caf", "##e", "##é", "naive", "na", "##ive", "中", "文", "日", "本", "x",
              "##x", "y", "##y", "z", "##z", "a", "##b", "##a", "def", "f", ":", "-", ">", "return", "'", "t",
              "don", "σ", "ο", "##δ", "##ο", "##σ", "##ς", "i", "##stanbul", "🙂", "1", "##2", "##3", "3", "##4"]


def _hf(vocab_file, lower_case):
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizer(vocab_file, do_lower_case=lower_case)


def _hf_ids(hf, text):
    return hf.encode(text, add_special_tokens=False, split_special_tokens=True)


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    corpus = sample_texts(150_000) + TEXTS
    return {
        "learned-lower": (write_vocab(build_wordpiece_vocab(corpus, 1500, lower_case=True), d / "lower.txt"), True),
        "learned-cased": (write_vocab(build_wordpiece_vocab(corpus, 1500, lower_case=False), d / "cased.txt"), False),
        "hand-lower": (write_vocab(HAND_VOCAB, d / "hand.txt"), True),
        "hand-cased": (str(d / "hand.txt"), False),
    }


@pytest.mark.parametrize("which", ["learned-lower", "learned-cased", "hand-lower", "hand-cased"])
def test_ids_and_text_equal_hugging_face(vocab_files, which):
    path, lower = vocab_files[which]
    hf, ours = _hf(path, lower), BertWordPieceTokenizer(str(path), lower)
    assert ours.vocab_size == hf.vocab_size
    for text in TEXTS + sample_texts(30_000)[:8]:
        ids = ours.tokenize(text)
        assert ids == _hf_ids(hf, text), text
        assert ours.text_to_tokens(text) == hf.convert_ids_to_tokens(ids)
        assert ours.detokenize(ids) == hf.decode(ids), text


def test_every_common_character_is_cleaned_and_split_as_hugging_face_does(vocab_files):
    """Character by character over the scripts text is written in. (HF's Unicode tables are of other
    versions than Python's for a few hundred rare code points, added to Unicode recently.)"""
    blocks = [(0, 0x250), (0x370, 0x530), (0x2000, 0x2070), (0x3000, 0x3100), (0x4E00, 0x4F00), (0xFE30, 0xFFFF),
              (0x1F300, 0x1F700)]
    for path, lower in (vocab_files["hand-lower"], vocab_files["hand-cased"]):
        hf = _hf(path, lower).backend_tokenizer
        for lo, hi in blocks:
            for cp in range(lo, hi):
                text = f"a{chr(cp)}b {chr(cp)}X"
                words = [w for w, _ in hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(text))]
                assert split_words(text, lower) == words, hex(cp)


def test_special_ids_eod_and_lookups(vocab_files):
    tok = BertWordPieceTokenizer(vocab_files["hand-lower"][0], lower_case=True)
    assert (tok.pad, tok.unk, tok.cls, tok.sep, tok.mask, tok.eod) == (0, 1, 2, 3, 4, 3)
    assert tok.vocab["hello"] == 5 and tok.inv_vocab[5] == "hello" and tok.vocab_size == len(HAND_VOCAB)
    assert tok.text_to_tokens("HELLO, naiveo Worlds") == ["hello", ",", "naive", "##o", "[UNK]"]
    assert tok.tokenize("x" * 100) == [tok.vocab["x"]] + [tok.vocab["##x"]] * 99
    assert tok.tokenize("x" * 101) == [tok.unk]
    cased = build_tokenizer(types.SimpleNamespace(tokenizer_type="BertWordPieceCase",
                                                  vocab_file=vocab_files["hand-cased"][0]))
    assert cased.text_to_tokens("HELLO Hello hello café") == ["HELLO", "Hello", "hello", "café"]
    assert pickle.loads(pickle.dumps(cased)).tokenize("Hello café") == cased.tokenize("Hello café")


def test_learned_vocab_covers_its_text_and_is_deterministic(tmp_path):
    corpus = sample_texts(60_000)
    vocab = build_wordpiece_vocab(corpus, 800, lower_case=True)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) == 800
    assert len(set(vocab)) == len(vocab) and vocab == build_wordpiece_vocab(corpus, 800, lower_case=True)
    assert all(("##" + t) in vocab for t in vocab[5:] if len(t) == 1)  # each character in both forms
    tok = BertWordPieceTokenizer(write_vocab(vocab, tmp_path / "v.txt"))
    ids = [i for text in corpus for i in tok.tokenize(text)]
    words = sum(len(split_words(text, True)) for text in corpus)
    assert tok.unk not in ids and len(ids) < 1.6 * words  # learned pieces: far fewer ids than characters
    with pytest.raises(TokenizerError, match="use a vocab size of at least"):
        build_wordpiece_vocab(corpus, 50, lower_case=True)


@pytest.mark.parametrize("content, problem", [
    (None, "no such file"), (b"", "is empty"), (b"\xff\xfe\x00bad", "cannot be read as UTF-8"),
    (b"[PAD]\n[UNK]\n[CLS]\nhello\n", "lacks [SEP] [MASK]"),
])
def test_bad_vocab_files_are_clear_errors(tmp_path, content, problem):
    path = tmp_path / "vocab.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TokenizerError) as e:
        BertWordPieceTokenizer(str(path))
    assert problem in str(e.value) and str(path) in str(e.value) and "train_tokenizer.py" in str(e.value)
    with pytest.raises(TokenizerError, match="needs --vocab-file"):
        build_tokenizer(types.SimpleNamespace(tokenizer_type="BertWordPieceLowerCase", vocab_file=None))


def test_train_tokenizer_tool_writes_a_vocab_file(tmp_path):
    jsonl = write_jsonl(tmp_path / "c.jsonl", sample_texts(40_000) + TEXTS)
    proc = run_tool("train_tokenizer.py", ["--tokenizer-type", "BertWordPieceCase", "--input", jsonl,
                                           "--model-prefix", tmp_path / "tok" / "bert", "--vocab-size", 700])
    assert proc.returncode == 0, proc.stderr
    path = str(tmp_path / "tok" / "bert.vocab.txt")
    assert f"--tokenizer-type BertWordPieceCase --vocab-file {path}" in proc.stdout
    tok = BertWordPieceTokenizer(path, lower_case=False)
    assert tok.vocab_size == 700 and tok.unk not in tok.tokenize(TEXTS[0] + " Café 中文")
    proc = run_tool("train_tokenizer.py", ["--tokenizer-type", "BertWordPieceCase", "--input", jsonl,
                                           "--model-prefix", tmp_path / "small", "--vocab-size", 20])
    assert proc.returncode == 2 and "use a vocab size of at least" in proc.stderr
    assert not (tmp_path / "small.vocab.txt").exists()
