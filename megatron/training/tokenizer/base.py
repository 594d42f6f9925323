"""What every tokenizer offers, and its error type.

A tokenizer has `vocab_size` (ids are 0..vocab_size-1), `eod` (the end-of-document id that
preprocess_data.py --append-eod adds), `tokenize(text) -> list[int]`, `detokenize(ids) -> str`.
"""
import os

from ...core.errors import TokenizerError


def require_file(flag, path, needed_by, fix=None):
    """TokenizerError unless `path` (given with `flag`) names a file; the message ends with `fix`."""
    tail = f"; {fix}" if fix else ""
    if not path:
        raise TokenizerError(f"{needed_by} needs {flag}{tail}")
    if not os.path.isfile(path):
        raise TokenizerError(f"{flag} {path}: no such file{tail}")
