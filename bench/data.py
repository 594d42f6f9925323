"""Data pipeline benchmark: C++ index helpers against their numpy references, preprocess throughput.

    PYTHONPATH=. python bench/data.py [--docs 100000 --tokens 50000000] [--text-mb 12] [--append]

1. Sample index for D documents / T tokens (1 epoch, seq 2048 and 128): C++ vs the numpy reference (ratio),
   and the blending index (3 datasets, 200k samples): C++ vs the Python reference.
2. tools/preprocess_data.py on stdlib source as jsonl: tokens/s with 1 and 2 workers, for
   SentencePiece (C++ tokenizer) and GPT2BPETokenizer (our pure-Python BPE).
Writes the table to bench/results/data_cpu.md (with date and command).
"""
import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from megatron.core.datasets import helpers
from megatron.core.datasets.gpt_dataset import _document_index


def best_of(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times), out


def bench_indices(num_docs, num_tokens, rows):
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 2 * num_tokens // num_docs, num_docs).astype(np.int32)
    doc_index = _document_index(np.arange(num_docs, dtype=np.int32), 1, np.random.RandomState(0))
    tokens = int(sizes.sum())
    for seq in (2048, 128):
        run = {impl: best_of(lambda i=impl, q=seq: helpers.build_sample_idx(sizes, doc_index, q, 1, tokens, impl=i), 7)
               for impl in ("cpp", "numpy")}
        assert np.array_equal(run["cpp"][2], run["numpy"][2])
        rows.append(("sample index", f"{num_docs:,} docs / {tokens:,} tokens, seq {seq} "
                     f"({len(run['cpp'][2]) - 1:,} samples)", run["cpp"][0], run["numpy"][0]))
    w = np.array([0.2, 0.3, 0.5])
    run = {impl: best_of(lambda i=impl: helpers.build_blending_indices(w, 200_000, impl=i), 3)
           for impl in ("cpp", "numpy")}
    assert all(np.array_equal(a, b) for a, b in zip(run["cpp"][2], run["numpy"][2]))
    rows.append(("blending index", "3 datasets, 200,000 samples", run["cpp"][0], run["numpy"][0]))


def bench_preprocess(text_mb, folder, rows, repeats=3):
    from megatron.core.datasets.text_corpus import stdlib_documents
    from tests.data_utils import make_gpt2_files, make_sentencepiece, write_jsonl
    texts = [d.decode("utf-8", errors="replace") for d in stdlib_documents(int(text_mb * 1e6))]
    jsonl = write_jsonl(os.path.join(folder, "in.jsonl"), texts)
    mb = os.path.getsize(jsonl) / 1e6
    spm = make_sentencepiece(folder, texts[:200], vocab_size=8000)
    vocab, merges = make_gpt2_files(folder, texts[:10], num_merges=500)
    toks = {"SentencePieceTokenizer": ["--tokenizer-model", spm],
            "GPT2BPETokenizer": ["--vocab-file", vocab, "--merge-file", merges]}
    env = dict(os.environ, PYTHONPATH=REPO)
    for name, flags in toks.items():
        for workers in (1, 2):
            cmd = [sys.executable, os.path.join(REPO, "tools", "preprocess_data.py"), "--input", jsonl,
                   "--output-prefix", os.path.join(folder, f"out-{workers}"), "--tokenizer-type", name, *flags,
                   "--append-eod", "--workers", str(workers), "--log-interval", "0"]
            best = None
            for _ in range(repeats):  # the best of a few runs: the least disturbed by other load
                t = time.perf_counter()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                wall = time.perf_counter() - t
                m = re.search(r"processed (\d+) documents, (\d+) tokens \(.*?, ([0-9.]+) MB/s, (\d+) tokens/s\)",
                              proc.stderr)
                row = (name, workers, int(m.group(2)), mb, float(m.group(4)), float(m.group(3)), wall)
                best = row if best is None or row[4] > best[4] else best
            rows.append(best)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--tokens", type=int, default=50_000_000)
    p.add_argument("--text-mb", type=float, default=12.0, help="stdlib source to use (all of it is about 12 MB)")
    p.add_argument("--append", action="store_true", help="append to the results file")
    args = p.parse_args()
    if helpers.helpers_cpp is None:
        sys.exit("the C++ helpers are not built: pip install -e . (or python setup.py build_ext --inplace)")
    idx_rows, pre_rows = [], []
    bench_indices(args.docs, args.tokens, idx_rows)
    with tempfile.TemporaryDirectory() as folder:
        bench_preprocess(args.text_mb, folder, pre_rows)
    lines = [
        "# Data pipeline: C++ index helpers vs numpy references, preprocess throughput (cpu)", "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- command: `PYTHONPATH=. python bench/data.py {' '.join(sys.argv[1:])}`".replace(" `", " `"),
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs (shared; load average at the end "
        f"{os.getloadavg()[0]:.1f}), python {platform.python_version()}, numpy {np.__version__}",
        "- timing: best of 7 (sample index) / 3 (blending) runs; preprocess: best of 3 runs, the tool's own rate",
        "", "| index | size | C++ s | numpy s | numpy / C++ |", "|---|---|---:|---:|---:|"]
    lines += [f"| {n} | {s} | {c:.4f} | {r:.4f} | {r / c:.1f}x |" for n, s, c, r in idx_rows]
    lines += ["",
              "| tokenizer | workers | tokens | input MB | tokens/s | MB/s | wall s |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {n} | {w} | {t:,} | {mb:.1f} | {tps:,.0f} | {mbs:.2f} | {wall:.1f} |"
              for n, w, t, mb, tps, mbs, wall in pre_rows]
    for name in dict.fromkeys(r[0] for r in pre_rows):
        one, two = [r[4] for r in pre_rows if r[0] == name]
        lines.append(f"\n{name}: 2 workers / 1 worker = {two / one:.2f}x")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    with open(os.path.join(REPO, "bench", "results", "data_cpu.md"), "a" if args.append else "w") as fh:
        fh.write(("\n" if args.append else "") + text)


if __name__ == "__main__":
    main()
