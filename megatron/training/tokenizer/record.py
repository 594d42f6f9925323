"""The record of a tokenizer that megatron/core/datasets/tokenizer_record.py writes beside a
dataset and compares: its type (aliases folded), vocabulary size and the SHA-256 of its files."""
import hashlib
import os

ALIASES = {"GPTSentencePieceTokenizer": "SentencePieceTokenizer"}  # the same class (tokenizer/__init__.py)


def _sha256(paths):
    """Over each path's bytes (a folder: its files' names and bytes, sorted; a name that is no local
    path, e.g. a Hub id: the name itself)."""
    h = hashlib.sha256()
    for path in paths:
        files = sorted(os.path.join(path, n) for n in os.listdir(path)) if os.path.isdir(path) else [path]
        for f in files:
            h.update(os.path.basename(f).encode() + b"\0")
            if os.path.isfile(f):
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
            elif not os.path.isdir(f):
                h.update(f.encode())
    return h.hexdigest()


def tokenizer_record(cfg, tokenizer):
    """{"tokenizer_type", "vocab_size", "files_sha256", "files"} of `tokenizer`, built from `cfg` (the
    TrainingConfig or a tool's arguments: tokenizer_type, vocab_file, merge_file, tokenizer_model)."""
    paths = [p for p in (getattr(cfg, n, None) for n in ("vocab_file", "merge_file", "tokenizer_model")) if p]
    return {"tokenizer_type": ALIASES.get(cfg.tokenizer_type, cfg.tokenizer_type), "vocab_size": tokenizer.vocab_size,
            "files_sha256": _sha256(paths) if paths else None, "files": [os.path.basename(p) for p in paths]}
