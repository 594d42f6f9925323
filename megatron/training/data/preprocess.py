"""Streaming jsonl -> Megatron indexed datasets, for tools/preprocess_data.py and the embedded corpus.

One document per line; each --json-keys field becomes {output_prefix}_{key}_document.bin/.idx,
one sequence per document. With a sentence splitter (--split-sentences) it becomes
{output_prefix}_{key}_sentence.bin/.idx instead: each sentence is one sequence and the document
index groups a document's sentences, as Megatron-LM writes BERT data (empty sentences are
dropped; eod goes at the end of the last sentence). A document with no tokens (empty text, or no
sentence left) is kept as an empty document: a document boundary with no sequence and no eod,
as Megatron-LM's preprocess_data.py writes it.
Memory stays flat: lines are read lazily, at most `4 x workers` batches are in flight, and the
writer spills its index to disk (indexed_builder.py). Output order is input order, so any
number of workers (and partitions) writes the same bytes.
"""
import json
import multiprocessing
import os
import sys
import time
from collections import deque

import numpy as np

from ...core.datasets.indexed_builder import IndexedDatasetBuilder
from ...core.datasets.indexed_dataset import optimal_dtype
from ...core.errors import MegatronUserError
from ..tokenizer import build_tokenizer

BATCH_LINES, BATCH_BYTES = 256, 1 << 20
_worker_tokenizer = None


class MalformedLine(MegatronUserError):
    def __init__(self, path, lineno, problem):
        super().__init__(f"{path} line {lineno}: {problem} (--skip-malformed skips such lines)")
        self.lineno, self.problem = lineno, problem


def output_prefix_for(output_prefix, key, sentences=False):
    """The dataset written for one json key: PREFIX_KEY_document, or PREFIX_KEY_sentence when split."""
    return f"{output_prefix}_{key}_{'sentence' if sentences else 'document'}"


def read_lines(path, start=0, stop=None):
    """(line number, bytes) of the lines that begin in bytes [start, stop) of the file, lazily."""
    with open(path, "rb") as fh:
        lineno = 1
        if start > 0:  # count the lines before this partition, and skip a line already begun
            fh.seek(0)
            remaining = start - 1
            while remaining > 0:
                chunk = fh.read(min(remaining, 1 << 24))
                lineno += chunk.count(b"\n")
                remaining -= len(chunk)
            if fh.read(1) != b"\n":  # inside a line that began before start: skip its rest
                fh.readline()
            lineno += 1
        while stop is None or fh.tell() < stop:
            line = fh.readline()
            if not line:
                return
            yield lineno, line
            lineno += 1


def _batches(lines):
    batch, size = [], 0
    for lineno, line in lines:
        batch.append((lineno, line))
        size += len(line)
        if len(batch) >= BATCH_LINES or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _init_worker(tokenizer_args):
    global _worker_tokenizer
    _worker_tokenizer = build_tokenizer(tokenizer_args)


def encode_document(tokenizer, line, json_keys, append_eod, splitter=None):
    """A jsonl line -> {key: (int array, sequence lengths)}, or a str saying what is wrong.

    Without a splitter the document is one sequence; with one (text -> list of sentences), each
    non-empty sentence is one. eod, if asked, ends the last sequence. A document without tokens has
    no sequence (lengths []) and so no eod either.
    """
    try:
        doc = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return "not valid UTF-8"
    except json.JSONDecodeError as e:
        return f"not valid JSON ({e.msg} at column {e.colno})"
    if not isinstance(doc, dict):
        return f"expected a JSON object, got {type(doc).__name__}"
    out = {}
    for key in json_keys:
        if key not in doc:
            return f"no key {key!r} (--json-keys {' '.join(json_keys)})"
        if not isinstance(doc[key], str):
            return f"{key!r} is of type {type(doc[key]).__name__}, not a string"
        try:
            texts = [doc[key]] if splitter is None else splitter(doc[key])
            seqs = [ids for ids in map(tokenizer.tokenize, texts) if len(ids)]
        except (ValueError, TypeError) as e:
            return f"{key!r} cannot be tokenized ({e})"
        if append_eod and seqs:
            seqs[-1] = list(seqs[-1]) + [tokenizer.eod]
        ids = np.asarray([i for seq in seqs for i in seq], dtype=np.int32)  # half of int64's bytes between processes
        out[key] = (ids, [len(seq) for seq in seqs])
    return out


def _encode_batch(batch, json_keys, append_eod, splitter, tokenizer=None):
    tok = tokenizer or _worker_tokenizer
    return [(lineno, len(line), None if not line.strip() else encode_document(tok, line, json_keys, append_eod,
                                                                              splitter))
            for lineno, line in batch]


class Progress:
    """Counts, and a line on stderr every log_interval documents: documents/s and MB/s."""

    def __init__(self, log_interval, label=""):
        self.docs = self.skipped = self.tokens = self.bytes = 0
        self.log_interval, self.label, self.start = log_interval, label, time.perf_counter()

    def add(self, nbytes, ntokens):
        self.docs += 1
        self.bytes += nbytes
        self.tokens += ntokens
        if self.log_interval and self.docs % self.log_interval == 0:
            self.report()

    def report(self, final=False):
        t = max(time.perf_counter() - self.start, 1e-9)
        print(f"{self.label}{'done: ' if final else ''}processed {self.docs} documents, {self.tokens} tokens "
              f"({self.docs / t:.1f} docs/s, {self.bytes / t / 1e6:.2f} MB/s, {self.tokens / t:.0f} tokens/s)"
              + (f", skipped {self.skipped} malformed lines" if self.skipped else ""), file=sys.stderr, flush=True)


def preprocess_range(input_path, output_prefix, tokenizer_args, json_keys, append_eod=False, workers=1,
                     skip_malformed=False, log_interval=10000, start=0, stop=None, label="", splitter=None):
    """Encode the lines of input_path that begin in bytes [start, stop); returns a Progress.

    Raises MalformedLine on a bad line unless skip_malformed (then each is reported and counted).
    splitter (a picklable text -> sentences function) writes one sequence per sentence.
    """
    tokenizer = build_tokenizer(tokenizer_args)
    dtype = optimal_dtype(tokenizer.vocab_size)
    builders = {k: IndexedDatasetBuilder(output_prefix_for(output_prefix, k, splitter is not None), dtype)
                for k in json_keys}
    progress = Progress(log_interval, label)
    pool = multiprocessing.Pool(workers, _init_worker, (tokenizer_args,)) if workers > 1 else None
    try:
        pending = deque()
        for batch in _batches(read_lines(input_path, start, stop)):
            if pool is None:
                _write(_encode_batch(batch, json_keys, append_eod, splitter, tokenizer), builders, progress,
                       input_path, skip_malformed)
                continue
            pending.append(pool.apply_async(_encode_batch, (batch, json_keys, append_eod, splitter)))
            while len(pending) >= 4 * workers:  # bounded: the reader never runs far ahead
                _write(pending.popleft().get(), builders, progress, input_path, skip_malformed)
        while pending:
            _write(pending.popleft().get(), builders, progress, input_path, skip_malformed)
    except BaseException:
        if pool is not None:
            pool.terminate()
        for b in builders.values():
            b.abort()
        raise
    if pool is not None:
        pool.close()
        pool.join()
    for b in builders.values():
        b.finalize()
    return progress


def _write(results, builders, progress, input_path, skip_malformed):
    for lineno, nbytes, encoded in results:
        if encoded is None:  # a blank line
            continue
        if isinstance(encoded, str):
            if not skip_malformed:
                raise MalformedLine(input_path, lineno, encoded)
            progress.skipped += 1
            print(f"warning: {input_path} line {lineno}: {encoded}; skipped", file=sys.stderr)
            continue
        for key, (ids, lengths) in encoded.items():
            builders[key].add_document(ids, lengths)  # lengths [] writes an empty document
        progress.add(nbytes, sum(len(ids) for ids, _ in encoded.values()))


def partition_bounds(path, partitions):
    size = os.path.getsize(path)
    return [(size * i // partitions, size * (i + 1) // partitions) for i in range(partitions)]
