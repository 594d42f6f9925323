"""GPT-2's byte-level BPE (vocab.json + merges.txt), implemented here (no download, no HF).

Text -> regex pre-tokens (words, numbers, punctuation runs, whitespace) -> each pre-token's
UTF-8 bytes as printable unicode symbols (bytes_to_unicode) -> merges applied by rank ->
ids from vocab.json. The end-of-document id is that of "<|endoftext|>".

The literal text "<|endoftext|>" inside a document is that id, not the characters: Megatron-LM's
current GPT2BPETokenizer is Hugging Face's GPT-2 tokenizer, which matches "<|endoftext|>" as a
special token before pre-tokenizing, so a corpus that marks document ends in its text keeps them.
The pre-tokenizer needs the `regex` package (Unicode letter and number classes); the stdlib
`re` would split some text differently, so there is no fallback.
"""
import json
from functools import lru_cache

from .base import TokenizerError, require_file

try:  # a dependency (setup.py); checked when the tokenizer is used, so other tokenizers work without it
    import regex
except ImportError:
    regex = None

_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

EOD_TOKEN = "<|endoftext|>"


@lru_cache
def bytes_to_unicode():
    """byte (0..255) -> a printable unicode character, as GPT-2 maps them.

    Printable Latin-1 bytes map to themselves; the rest to 256, 257, ... so no BPE symbol
    is whitespace or a control character.
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def pretokenize(text):
    """GPT-2's split of text into pre-tokens (merges never cross them)."""
    if regex is None:
        raise TokenizerError("GPT2BPETokenizer needs the `regex` package (pip install regex): GPT-2's "
                             "pre-tokenizer uses its \\p{L} / \\p{N} classes")
    return regex.findall(_PATTERN, text)


def _read_merges(merge_file, vocab):
    ranks = {}
    with open(merge_file, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\n")
            if not line or (lineno == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise TokenizerError(f"{merge_file} line {lineno}: expected two symbols separated by "
                                     f"one space, got {line!r}")
            if parts[0] + parts[1] not in vocab:
                raise TokenizerError(f"{merge_file} line {lineno}: merge result {parts[0] + parts[1]!r} "
                                     f"is not in the vocabulary; vocab.json and merges.txt do not match")
            ranks.setdefault(tuple(parts), len(ranks))
    return ranks


class GPT2BPETokenizer:
    """Byte-level BPE from a GPT-2 style vocab.json (symbol -> id) and merges.txt (ranked pairs)."""

    def __init__(self, vocab_file, merge_file):
        pretokenize("")  # fails now, with the fix, if `regex` is missing
        for flag, path in (("--vocab-file", vocab_file), ("--merge-file", merge_file)):
            require_file(flag, path, "--tokenizer-type GPT2BPETokenizer")
        try:
            with open(vocab_file, encoding="utf-8") as fh:
                self.encoder = json.load(fh)
        except (ValueError, UnicodeDecodeError) as e:
            raise TokenizerError(f"--vocab-file {vocab_file} is not a JSON vocabulary: {e}") from None
        if not isinstance(self.encoder, dict) or not all(isinstance(v, int) for v in self.encoder.values()):
            raise TokenizerError(f"--vocab-file {vocab_file} must map symbols to integer ids")
        self.byte_encoder = bytes_to_unicode()
        missing = [c for c in self.byte_encoder.values() if c not in self.encoder]
        if missing:
            raise TokenizerError(f"--vocab-file {vocab_file} lacks {len(missing)} of the 256 byte symbols; "
                                 "it is not a byte-level BPE vocabulary")
        if EOD_TOKEN not in self.encoder:
            raise TokenizerError(f"--vocab-file {vocab_file} has no {EOD_TOKEN} (the end-of-document token)")
        self.bpe_ranks = _read_merges(merge_file, self.encoder)
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.vocab_size = max(self.encoder.values()) + 1
        self.eod = self.encoder[EOD_TOKEN]
        self._cache = {}

    def bpe(self, word):
        """A pre-token's symbols (str) -> its BPE pieces (tuple of str)."""
        if word in self._cache:
            return self._cache[word]
        parts = tuple(word)
        while len(parts) > 1:
            pairs = set(zip(parts, parts[1:]))
            best = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if best not in self.bpe_ranks:
                break
            merged, i = [], 0
            while i < len(parts):  # merge every occurrence of `best`, left to right
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = tuple(merged)
        if len(self._cache) > 200_000:  # bounded memory on huge corpora
            self._cache.clear()
        self._cache[word] = parts
        return parts

    def tokenize(self, text):
        """text -> ids; each literal "<|endoftext|>" is the eod id, the text between them is
        encoded piece by piece (see the module docstring)."""
        ids = []
        for k, piece in enumerate(text.split(EOD_TOKEN)):
            if k:
                ids.append(self.eod)
            for token in pretokenize(piece):
                symbols = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
                ids.extend(self.encoder[p] for p in self.bpe(symbols))
        return ids

    def detokenize(self, ids):
        text = "".join(self.decoder[i] for i in ids)
        return bytearray(self.byte_decoder[c] for c in text if c in self.byte_decoder).decode(
            "utf-8", errors="replace")
