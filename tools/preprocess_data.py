"""Tokenize a jsonl corpus into Megatron-LM's indexed format (.bin/.idx), streaming.

    python tools/preprocess_data.py --input corpus.jsonl --output-prefix data/my-corpus \\
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt \\
        --append-eod --workers 8
    # -> data/my-corpus_text_document.bin / .idx ; train with --data-path data/my-corpus_text_document
    #    and .tokenizer.json: which tokenizer made the ids, compared when trained on (tokenizer_record.py)

One JSON object per line; every --json-keys field (default text) becomes its own dataset.
--split-sentences (for BERT) writes PREFIX_KEY_sentence.bin/.idx instead: one sequence per
sentence, documents grouping their sentences (tools/sentence_splitter.py has the rules).
--partitions N splits the input by bytes into N parts processed at once (workers shared
among them), then joins them: the output is byte-identical to one partition and one worker.
A malformed line stops with its line number (exit 2), or with --skip-malformed is reported,
skipped and counted.
"""
import functools
import multiprocessing
import multiprocessing.connection
import os
import sys

if __package__ in (None, ""):  # run from a checkout: make `megatron` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.datasets.indexed_builder import IndexedDatasetBuilder
from megatron.core.datasets.indexed_dataset import (
    data_file_path,
    index_file_path,
    optimal_dtype,
)
from megatron.core.datasets.tokenizer_record import record_path, write_record
from megatron.core.errors import MegatronUserError
from megatron.training.config.output_paths import check_writable
from megatron.training.data.preprocess import output_prefix_for, partition_bounds, preprocess_range
from megatron.training.tokenizer import add_tokenizer_args, build_tokenizer
from megatron.training.tokenizer.record import tokenizer_record
from tools.sentence_splitter import split_sentences
from tools.tool_args import ToolParser, has_text


def parse_args(argv=None):
    p = ToolParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    g = p.add_argument_group("input and output")
    g.add_argument("--input", required=True, help="jsonl file, one document per line")
    g.add_argument("--json-keys", nargs="+", default=["text"], help="fields to tokenize (default text)")
    g.add_argument("--output-prefix", required=True,
                   help="writes PREFIX_KEY_document.bin/.idx per key (PREFIX_KEY_sentence with --split-sentences)")
    g.add_argument("--append-eod", action="store_true", help="end every document with the tokenizer's eod id")
    g.add_argument("--split-sentences", action="store_true",
                   help="one sequence per sentence, grouped by document (BERT data); line breaks end sentences")
    g.add_argument("--keep-newlines", action="store_true",
                   help="with --split-sentences: line breaks do not end sentences and stay in their text")
    g.add_argument("--workers", type=int, default=1, help="tokenizing processes in all (default 1)")
    g.add_argument("--partitions", type=int, default=1, help="split the input into this many parts run at once")
    g.add_argument("--skip-malformed", action="store_true",
                   help="report, skip and count malformed lines instead of stopping at the first")
    g.add_argument("--log-interval", type=int, default=10000, help="progress line every this many documents")
    add_tokenizer_args(p)
    args = p.parse_args(argv)
    if args.workers < 1 or args.partitions < 1:
        p.error("--workers and --partitions must be at least 1")
    if args.keep_newlines and not args.split_sentences:
        p.error("--keep-newlines goes with --split-sentences")
    return args


def _splitter(args):
    """The sentence splitter preprocess_range sends to its workers, or None (whole documents)."""
    return functools.partial(split_sentences, keep_newlines=args.keep_newlines) if args.split_sentences else None


def _dataset(prefix, key, args):
    return output_prefix_for(prefix, key, args.split_sentences)


def _run_partition(args, i, start, stop, conn):
    try:
        prog = preprocess_range(args.input, f"{args.output_prefix}.part{i}", args, args.json_keys,
                                args.append_eod, max(1, args.workers // args.partitions), args.skip_malformed,
                                args.log_interval, start, stop, label=f"[partition {i + 1}/{args.partitions}] ",
                                splitter=_splitter(args))
        conn.send((True, (prog.docs, prog.skipped, prog.tokens, prog.bytes)))
    except (MegatronUserError, OSError) as e:
        conn.send((False, str(e)))


def _remove_dataset(prefix):
    """The dataset, its tokenizer record and whatever a stopped writer left (its .partial files)."""
    for path in (data_file_path(prefix), index_file_path(prefix), record_path(prefix)):
        for suffix in ("", ".partial", ".sizes.partial", ".docs.partial"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)


def run_partitions(args, dtype):
    bounds = partition_bounds(args.input, args.partitions)
    procs, conns = [], []
    for i, (start, stop) in enumerate(bounds):
        recv, send = multiprocessing.Pipe(duplex=False)
        proc = multiprocessing.Process(target=_run_partition, args=(args, i, start, stop, send))
        proc.start()
        send.close()  # the child holds the sending end; EOF here means it died
        procs.append(proc)
        conns.append(recv)
    results, waiting = [None] * len(procs), dict(zip(conns, range(len(procs))))
    while waiting:  # results as they come: the first failure stops the others at once
        for conn in multiprocessing.connection.wait(list(waiting)):
            i = waiting.pop(conn)
            try:
                results[i] = conn.recv()
            except EOFError:
                procs[i].join()
                results[i] = (False, f"partition {i + 1} died (exit code {procs[i].exitcode})")
            if not results[i][0]:
                for proc in procs:
                    proc.terminate()
                waiting = {}
                break
    for proc in procs:
        proc.join()
    parts = [_dataset(f"{args.output_prefix}.part{i}", k, args) for i in range(len(bounds)) for k in args.json_keys]
    try:
        for result in results:
            if result is not None and not result[0]:
                raise RuntimeError(result[1])
        for key in args.json_keys:  # join the parts in input order
            builder = IndexedDatasetBuilder(_dataset(args.output_prefix, key, args), dtype)
            try:
                for i in range(len(bounds)):
                    builder.add_index(_dataset(f"{args.output_prefix}.part{i}", key, args))
            except BaseException:
                builder.abort()
                raise
            builder.finalize()
    finally:
        for prefix in parts:
            _remove_dataset(prefix)
    return [sum(r[1][j] for r in results) for j in range(4)]


def _refuse_empty(args, skipped):
    """No document was read: remove the empty datasets just written, and say why."""
    for key in args.json_keys:
        _remove_dataset(_dataset(args.output_prefix, key, args))
    why = f"all {skipped} non-blank lines were malformed" if skipped else "it has no non-blank line"
    raise MegatronUserError(f"--input {args.input}: no documents to write ({why}); nothing was written")


def main(argv=None):
    args = parse_args(argv)
    try:
        if not os.path.isfile(args.input):
            raise FileNotFoundError(f"--input {args.input}: no such file")
        if not has_text(args.input):  # before any folder or file is made
            raise MegatronUserError(f"--input {args.input}: the file is empty (or only blank lines); "
                                    "nothing to preprocess, nothing was written")
        check_writable(args.output_prefix, "--output-prefix", kind="file")
        os.makedirs(os.path.dirname(os.path.abspath(args.output_prefix)), exist_ok=True)
        tokenizer = build_tokenizer(args)  # bad tokenizer files fail here, before any work
        if args.workers > 1 and args.tokenizer_type == "HuggingFaceTokenizer":
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # we parallelise by process
        if args.partitions == 1:
            prog = preprocess_range(args.input, args.output_prefix, args, args.json_keys, args.append_eod,
                                    args.workers, args.skip_malformed, args.log_interval, splitter=_splitter(args))
            docs, skipped = prog.docs, prog.skipped
            if docs == 0:
                _refuse_empty(args, skipped)
            prog.report(final=True)
        else:
            docs, skipped, tokens, nbytes = run_partitions(args, optimal_dtype(tokenizer.vocab_size))
            if docs == 0:
                _refuse_empty(args, skipped)
            print(f"done: processed {docs} documents, {tokens} tokens in {args.partitions} partitions"
                  + (f", skipped {skipped} malformed lines" if skipped else ""), file=sys.stderr)
        for key in args.json_keys:  # which tokenizer made the ids: checked when trained on (tokenizer_record.py)
            write_record(_dataset(args.output_prefix, key, args), tokenizer_record(args, tokenizer))
    except (MegatronUserError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key in args.json_keys:
        print(f"wrote {_dataset(args.output_prefix, key, args)}.bin/.idx "
              f"(train with --data-path {_dataset(args.output_prefix, key, args)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
