"""Checkpoint I/O per loading rank at 8, 64 and 512 simulated ranks, and the stall of a save.

    python bench/checkpoint_scale.py                  # both tables, appended to bench/results/
    python bench/checkpoint_scale.py --ranks 8 64     # I/O table for these N only

I/O: megatron/core/checkpointing/scale_sim.py drives the real save (storage.py) and indexed
load (index_reader.py) for every rank of a GPT-175B-shaped layout (96 layers, TP 8, PP N/8
capped at 16, DP the rest, distributed optimizer) on a tiny hidden size, in one process.
Per loading rank: bytes read against its shard (fp32 param TP shard + its optimizer ranges),
files opened against the files holding its pieces, and the index bytes it reads (format 2:
the per-tensor index files of the tensors it holds, only its TP shards' records). "before" is
the reader without the index (reading.py's CheckpointReader): every rank opens all N files and reads all their bytes.
Stall: bench/checkpoint_stall.py (one process, a real model and optimizer).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from megatron.core.checkpointing import read_metadata
from megatron.core.checkpointing import scale_sim as sim
from megatron.core.checkpointing.index_reader import read_index

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_stall import append_result  # noqa: E402


def layout_for(n):
    pp = min(max(n // 8, 1), 16)
    return sim.Layout(n, 8, pp=pp)  # DP what TP 8 x PP leaves of n


def _index_size(path):
    """Bytes of the checkpoint's index (format 2: all per-tensor files; format 1: index.json)."""
    root = os.path.join(path, "index")
    if not os.path.isdir(root):
        return os.path.getsize(os.path.join(path, "index.json"))
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def _row(n, layout, ios, total, index_bytes, mode, check):
    ratio = max(io.bytes_read / io.shard_bytes for io in ios)
    return (f"| {n} | {layout.tp}x{layout.pp}x{layout.dp} | {mode} | {total / 2**20:.1f} | {index_bytes / 2**20:.2f} | "
            f"{max(io.index_bytes for io in ios) / 2**10:.1f} | "
            f"{max(io.index_bytes / io.shard_bytes for io in ios):.2f} | "
            f"{max(io.index_files for io in ios)} | "
            f"{statistics.median(io.shard_bytes for io in ios) / 2**10:.0f} | "
            f"{statistics.median(io.bytes_read for io in ios) / 2**10:.0f} | {ratio:.3f} | "
            f"{max(io.files_opened for io in ios)} | {max(io.files_holding for io in ios)} | "
            f"{sum(io.bytes_read for io in ios) / 2**20:.1f} | {max(io.received for io in ios) / 2**10:.0f} | "
            f"{all(io.correct for io in ios) if check else 'not checked'} |")


def io_table(ranks, hidden, vocab, check_up_to):
    rows = ["| N | TPxPPxDP | load | ckpt MiB | index MiB | max index KiB read by a rank | max index/shard "
            "| max index files read "
            "| shard KiB (median) | read KiB (median) | max read/shard "
            "| max files opened | max files holding its pieces | all ranks read MiB | max bcast recv KiB | exact |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    tensors = sim.gpt_tensors(96, hidden, vocab)
    for n in ranks:
        layout = layout_for(n)
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            path = sim.save(d, tensors, 96, layout)
            t_save = time.perf_counter() - t0
            meta = read_metadata(path)
            total = sum(meta["files"].values())
            index = read_index(path, meta)
            rows.append(f"| {n} | {layout.tp}x{layout.pp}x{layout.dp} | before: no index | {total / 2**20:.1f} | "
                        f"- | - | - | - | - | {total / 2**10:.0f} | - | {n} | - | {n * total / 2**20:.1f} | - | - |")
            for mode, bcast in (("each rank its shard", False), ("DP rank 0 + broadcast", True)):
                if bcast and layout.dp == 1:
                    continue
                t0 = time.perf_counter()
                ios = sim.load(path, tensors, 96, layout, index, check=n <= check_up_to, dp_broadcast=bcast)
                print(f"N={n} {mode}: save {t_save:.1f} s, load {time.perf_counter() - t0:.1f} s", flush=True)
                rows.append(_row(n, layout, ios, total, _index_size(path), mode, n <= check_up_to))
        print(rows[-1], flush=True)
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--check-up-to", type=int, default=64,
                   help="compare every value read with the saved one for N up to this (slow in one process)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (more only contend on a busy machine)")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    table = io_table(a.ranks, a.hidden, a.vocab, a.check_up_to)
    print(table)
    if not a.no_write:
        append_result("checkpoint I/O per loading rank",
                      f"- model: GPT-175B-shaped, 96 layers, hidden {a.hidden}, vocab {a.vocab} (padded per TP), "
                      "fp32 params + Adam moments; save and load in the same layout, distributed optimizer", table)

if __name__ == "__main__":
    main()
