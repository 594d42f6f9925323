"""BERT's WordPiece tokenizer over a vocab.txt (one token per line, id = line number).

Written here, with no transformers/tokenizers import, to give the ids Hugging Face's
`BertTokenizer(vocab_file, do_lower_case=...)` gives (checked in tests/unit/test_bert_tokenizer.py):

1. clean: drop NUL, U+FFFD and control, format and private-use characters (Unicode Cc Cf Co Cs,
   but not tab, newline, carriage return); every whitespace character becomes a space; CJK ideographs
   get a space on each side (so each is a word of its own);
2. lower-case only: canonical decomposition (NFD), combining marks (Mn) dropped, then each
   character lower-cased on its own (as HF does: no final-sigma rule);
3. split on whitespace, and every punctuation character (ASCII symbols and Unicode P*) is a word;
4. each word -> the longest vocab entry that starts it, then the longest "##"-prefixed entry that
   continues it, and so on; a word with no such split, or over 100 characters, is one [UNK].

One deliberate difference: "[MASK]", "[SEP]", ... written in the text are ordinary text here
(split into "[", "mask", "]"), as in Google's BERT and Megatron-LM, so a document cannot forge the
tokens the BERT dataset inserts. HF matches them as special tokens unless `split_special_tokens=True`.
Character classes come from Python's unicodedata; HF's Rust tables are of other Unicode versions, so
about 560 of the 1.1M code points (recently assigned, rare-script marks and punctuation) are classed
differently. Every other character, checked one by one against HF, is cleaned and split the same way.
"""
import unicodedata

from .base import TokenizerError, require_file

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION = "##"
MAX_WORD_CHARS = 100

# Blocks HF treats as CJK ideographs (its table, which skips U+2B820..U+2B91F).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def is_cjk(ch):
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def is_punctuation(ch):
    """ASCII symbols count too ($, +, <, ^, ` ...), though Unicode files them as S*."""
    return ch in _ASCII_PUNCTUATION or unicodedata.category(ch).startswith("P")


def _is_control(ch):
    # Unassigned code points (Cn) are kept, as HF keeps them: they may be assigned in a newer Unicode.
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs")


class _CharMap(dict):
    """A str.translate table filled on first sight of each character, so the per-character
    rules run once per distinct character, and the text loop stays in C."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def __missing__(self, cp):
        value = self[cp] = self.rule(chr(cp))
        return value


def _clean_rule(ch):
    if ch in "\0\ufffd" or _is_control(ch):
        return None
    if ch.isspace():  # Python's isspace = Unicode White_Space once controls are gone
        return " "
    return f" {ch} " if is_cjk(ch) else ch


_CLEAN = _CharMap(_clean_rule)
_DROP_MARKS = _CharMap(lambda ch: None if unicodedata.category(ch) == "Mn" else ch)
_LOWER = _CharMap(lambda ch: ch.lower())  # per character: "Σ" never becomes final "ς"
_SPLIT_PUNCTUATION = _CharMap(lambda ch: f" {ch} " if is_punctuation(ch) else ch)


def split_words(text, lower_case):
    """Steps 1-3 above: text -> the words WordPiece splits (str list)."""
    text = text.translate(_CLEAN)
    if lower_case:
        if not text.isascii():
            text = unicodedata.normalize("NFD", text).translate(_DROP_MARKS).translate(_LOWER)
        else:
            text = text.lower()
    return text.translate(_SPLIT_PUNCTUATION).split()


def read_vocab(vocab_file):
    """vocab.txt -> list of tokens (index = id), or TokenizerError naming the file and the fix."""
    fix = ("pass a BERT vocab.txt (one token per line), or make one from your text with "
           "tools/train_tokenizer.py --tokenizer-type BertWordPieceLowerCase")
    require_file("--vocab-file", vocab_file, "--tokenizer-type BertWordPieceLowerCase/BertWordPieceCase", fix)
    try:
        with open(vocab_file, encoding="utf-8") as fh:
            tokens = [line.rstrip("\n") for line in fh]
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"--vocab-file {vocab_file} cannot be read as UTF-8 text ({e}); {fix}") from None
    if not tokens:
        raise TokenizerError(f"--vocab-file {vocab_file} is empty; {fix}")
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise TokenizerError(f"--vocab-file {vocab_file} lacks {' '.join(missing)}; a BERT vocabulary needs "
                             f"all of {' '.join(SPECIAL_TOKENS)} (add them as lines, or {fix[0].lower() + fix[1:]})")
    return tokens


class BertWordPieceTokenizer:
    """WordPiece over vocab_file; lower_case=True is BertWordPieceLowerCase (lower-cases and
    strips accents), False is BertWordPieceCase. eod is [SEP], as in Megatron-LM."""

    def __init__(self, vocab_file, lower_case=True):
        self.vocab_file, self.lower_case = vocab_file, lower_case
        tokens = read_vocab(vocab_file)
        self.inv_vocab = dict(enumerate(tokens))
        self.vocab = {t: i for i, t in enumerate(tokens)}  # a repeated line keeps its last id, as in HF
        self.vocab_size = len(tokens)
        self.pad, self.unk, self.cls, self.sep, self.mask = (self.vocab[t] for t in SPECIAL_TOKENS)
        self.eod = self.sep
        self._cache = {}

    def word_pieces(self, word):
        """One word -> its WordPiece token strings (["[UNK]"] if it cannot be split)."""
        if len(word) > MAX_WORD_CHARS:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):  # longest match first
                piece = word[start:end] if start == 0 else CONTINUATION + word[start:end]
                if piece in self.vocab:
                    break
            else:
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    def _word_ids(self, word):
        ids = self._cache.get(word)
        if ids is None:
            if len(self._cache) > 200_000:  # bounded memory on huge corpora
                self._cache.clear()
            ids = self._cache[word] = [self.vocab[p] for p in self.word_pieces(word)]
        return ids

    def text_to_tokens(self, text):
        """The token strings of text (HF's tokenize())."""
        return [self.inv_vocab[i] for i in self.tokenize(text)]

    def tokenize(self, text):
        ids = []
        for word in split_words(text, self.lower_case):
            ids.extend(self._word_ids(word))
        return ids

    def detokenize(self, ids):
        """Tokens joined by spaces, "##" pieces glued to the one before, and a space before . , ! ?
        removed: what HF's decode() returns (special tokens kept)."""
        out = []
        for n, i in enumerate(ids):
            token = self.inv_vocab[int(i)]
            if n and token.startswith(CONTINUATION):
                token = token[len(CONTINUATION):]
            elif n:
                token = " " + token
            out.append(_cleanup(token))
        return "".join(out)

    def __getstate__(self):  # worker processes rebuild from the file; the word cache stays behind
        return {"vocab_file": self.vocab_file, "lower_case": self.lower_case}

    def __setstate__(self, state):
        self.__init__(state["vocab_file"], state["lower_case"])


_CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _cleanup(token):
    """HF's decoder tidies each token (with its leading space) by these replacements, in order."""
    for old, new in _CLEANUPS:
        token = token.replace(old, new)
    return token
