"""What every tokenizer offers, and its error type.

A tokenizer has `vocab_size` (ids are 0..vocab_size-1), `eod` (the end-of-document id that
preprocess_data.py --append-eod adds), `tokenize(text) -> list[int]`, `detokenize(ids) -> str`.
"""


class TokenizerError(ValueError):
    """A tokenizer cannot be built from the given files; the message says which and why."""
