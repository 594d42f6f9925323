"""Megatron-LM's TikTokenizer: byte-level BPE run by `tiktoken` from a local JSON vocabulary.

Optional dependency (`pip install tiktoken`); nothing is downloaded (the Encoding is built from
the file's ranks). The file (--tokenizer-model) is a JSON list whose entry i is
{"rank": i, "token_bytes": base64 of the token's bytes, "token_str": its text}; entries 0..255 are
the single bytes. As in Megatron-LM:

- ids 0..S-1 (S = --tiktoken-num-special-tokens, default 1000) are special tokens: the list
  --tokenizer-special-tokens (default <unk> <s> </s> <mask> <pad> <cls> <sep>, which any list must
  contain), then fillers <SPECIAL_i> up to S; the file's rank r gets id r + S;
- the vocabulary is --vocab-size (default 2**17) ids: the file is cut to its first vocab-size - S
  entries, and must have at least that many;
- eod is the id of </s> (2 by default); special tokens written in the text encode as their ids.
"""
import base64
import binascii
import json

from .base import TokenizerError, require_file

DEFAULT_VOCAB_SIZE = 2 ** 17
DEFAULT_NUM_SPECIAL = 1000
REQUIRED_SPECIAL = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"]

# Megatron-LM's two pre-tokenizer split patterns, one alternative per line
PATTERNS = {
    "v1": "|".join([
        r"[^\r\n\p{L}\p{N}]?+\p{L}+",
        r"\p{N}",
        r" ?[^\s\p{L}\p{N}]++[\r\n]*",
        r"\s*[\r\n]",
        r"\s+(?!\S)",
        r"\s+",
    ]),
    "v2": "|".join([
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
        r"\p{N}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]),
}


def special_token_list(given, count):
    """The S special tokens in id order: `given` (or the default seven), then <SPECIAL_i> fillers."""
    names = list(given) if given else list(REQUIRED_SPECIAL)
    if len(set(names)) != len(names):
        raise TokenizerError(f"--tokenizer-special-tokens {' '.join(names)}: each token may appear only once")
    missing = [t for t in REQUIRED_SPECIAL if t not in names]
    if missing:
        raise TokenizerError(f"--tokenizer-special-tokens must include {' '.join(REQUIRED_SPECIAL)} "
                             f"(missing {' '.join(missing)})")
    if count < len(names):
        raise TokenizerError(f"--tiktoken-num-special-tokens {count} is fewer than the {len(names)} special "
                             "tokens; raise it")
    names += [f"<SPECIAL_{i}>" for i in range(len(names), count)]
    if len(set(names)) != count:
        raise TokenizerError("--tokenizer-special-tokens clash with the <SPECIAL_i> fillers; rename them")
    return names


def load_ranks(path, keep, offset):
    """{token bytes: id} for the first `keep` entries of the JSON vocabulary, ids shifted by `offset`."""
    where = f"--tokenizer-model {path}"
    try:
        with open(path, encoding="utf-8") as fh:
            entries = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TokenizerError(f"{where} is not a readable JSON file: {e}") from None
    if not isinstance(entries, list):
        raise TokenizerError(f"{where}: expected a JSON list of {{rank, token_bytes, token_str}} entries")
    if len(entries) < keep:
        raise TokenizerError(f"{where} has {len(entries)} tokens, fewer than --vocab-size minus "
                             f"--tiktoken-num-special-tokens ({keep}); give --vocab-size {len(entries) + offset}")
    ranks = {}
    for i, entry in enumerate(entries[:keep]):
        if not isinstance(entry, dict) or set(entry) != {"rank", "token_bytes", "token_str"} or entry["rank"] != i:
            raise TokenizerError(f"{where}: entry {i} must be {{\"rank\": {i}, \"token_bytes\": ..., "
                                 "\"token_str\": ...}")
        try:
            token = base64.b64decode(entry["token_bytes"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise TokenizerError(f"{where}: entry {i} token_bytes is not base64") from None
        if i < 256 and token != bytes([i]):
            raise TokenizerError(f"{where}: entry {i} must be the single byte {i} (the first 256 entries are "
                                 "the bytes)")
        if token in ranks:
            raise TokenizerError(f"{where}: entry {i} repeats the bytes of entry {ranks[token] - offset}")
        ranks[token] = i + offset
    return ranks


class TikTokenizer:
    def __init__(self, path, vocab_size=None, num_special_tokens=DEFAULT_NUM_SPECIAL, special_tokens=None,
                 pattern=None):
        require_file("--tokenizer-model", path, "--tokenizer-type TikTokenizer",
                     "a JSON list of {rank, token_bytes, token_str}")
        try:
            import tiktoken
        except ImportError:
            raise TokenizerError("--tokenizer-type TikTokenizer needs the optional `tiktoken` package: "
                                 "pip install tiktoken") from None
        pattern = pattern or "v2"
        if pattern not in PATTERNS:
            raise TokenizerError(f"--tiktoken-pattern {pattern}: choose v1 or v2")
        vocab_size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
        if not 0 < num_special_tokens < vocab_size:
            raise TokenizerError(f"--tiktoken-num-special-tokens {num_special_tokens} must be at least 1 and "
                                 f"below --vocab-size {vocab_size}")
        self._args = (path, vocab_size, num_special_tokens, special_tokens, pattern)
        self.special_tokens = special_token_list(special_tokens, num_special_tokens)
        ranks = load_ranks(path, vocab_size - num_special_tokens, num_special_tokens)
        self._enc = tiktoken.Encoding(name="megatron-tiktoken", pat_str=PATTERNS[pattern], mergeable_ranks=ranks,
                                      special_tokens={t: i for i, t in enumerate(self.special_tokens)})
        self.vocab_size = vocab_size
        self.num_special_tokens = num_special_tokens
        self.eod = self.special_tokens.index("</s>")
        self.bos = self.special_tokens.index("<s>")

    def tokenize(self, text):
        return self._enc.encode(text, allowed_special="all")

    def detokenize(self, ids):
        return self._enc.decode([int(i) for i in ids])

    def __getstate__(self):
        return {"args": self._args}

    def __setstate__(self, state):
        self.__init__(*state["args"])
