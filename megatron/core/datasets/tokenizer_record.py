"""The tokenizer a dataset was written with, recorded beside it, and checked when it is trained on.

    PREFIX.bin, PREFIX.idx     Megatron-LM's indexed format, unchanged (any Megatron tool reads them)
    PREFIX.tokenizer.json      {"tokenizer_type", "vocab_size", "files_sha256", "files"}

Data made by another tokenizer than the one trained with is caught by its ids only when some id
reaches past the vocabulary (token_range.py); ByteTokenizer's ids (below 257) are all valid for a
SentencePiece model of 2,000 pieces, and train on garbage. tools/preprocess_data.py writes the record;
tools/merge_datasets.py carries it over when its inputs agree; the dataset builder compares it, where present,
with the run's (megatron/training/tokenizer/record.py makes both), and data without one (Megatron-LM's tools,
older files) is read as before. The type, the vocabulary size
and the SHA-256 of the tokenizer's files are compared; the file names are for the message only.
"""
import json
import os

from .indexed_dataset import DatasetError

SUFFIX = ".tokenizer.json"
COMPARED = ("tokenizer_type", "vocab_size", "files_sha256")


def record_path(prefix):
    return prefix + SUFFIX


def write_record(prefix, record):
    with open(record_path(prefix), "w") as f:
        json.dump(record, f, indent=1)


def read_record(prefix):
    """The record of the dataset at prefix, or None where there is none."""
    path = record_path(prefix)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: unreadable tokenizer record ({e}); delete it, or preprocess the data "
                           "again") from None
    return record


def describe(record):
    files = f", files {'+'.join(record.get('files') or [])} sha256 {record['files_sha256'][:12]}" \
        if record.get("files_sha256") else ""
    return f"{record.get('tokenizer_type')} (vocabulary {record.get('vocab_size')}{files})"


def check_record(prefix, expected):
    """DatasetError unless the record beside the dataset at prefix (if any) matches `expected`, the
    record of the run's tokenizer (None: nothing to compare)."""
    found = read_record(prefix) if expected is not None else None
    if found is None or all(found.get(k) == expected.get(k) for k in COMPARED):
        return
    raise DatasetError(f"{prefix}: the data was tokenized with {describe(found)} ({record_path(prefix)}), this run "
                       f"uses {describe(expected)}: train with the tokenizer it was made with, or preprocess it again "
                       "with this one (delete the record only if both give the same ids)")


def merged_record(prefixes):
    """The record of a dataset joined from `prefixes`: theirs when all have the same, None when one
    lacks it; DatasetError when two differ (the ids of two tokenizers in one dataset)."""
    records = [(p, read_record(p)) for p in prefixes]
    known = [(p, r) for p, r in records if r is not None]
    for p, r in known[1:]:
        if any(r.get(k) != known[0][1].get(k) for k in COMPARED):
            raise DatasetError(f"--input {known[0][0]} was tokenized with {describe(known[0][1])}, {p} with "
                               f"{describe(r)}: a dataset holds the ids of one tokenizer; merge them separately")
    return known[0][1] if known and len(known) == len(records) else None
