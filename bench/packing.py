"""Packed documents: the attention core (forward + backward) with document boundaries, against the same
documents as a dense [b, 1, s, s] mask, and against plain causal attention (which sees across documents).

    python bench/packing.py                                  # CPU, fp32: seq 4096 and 16384, mean doc 512, 2048
    python bench/packing.py --device cuda --dtype bf16 --out bench/results/gpu_suite/packing.md

Documents: lengths drawn from an exponential distribution with the given mean (seeded), at least 1, the last
one cut at the sequence end. For each path: the median forward + backward time over --rounds (alternating
the paths each round) and the largest single tensor any op produced (a TorchDispatchMode sees every output,
forward and backward) against s^2 elements: the packed path must hold no O(s^2) tensor.
"""
import argparse
import os
import platform
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.fusions import document_attention  # noqa: E402
from megatron.core.fusions.attention import sdpa  # noqa: E402
from megatron.core.transformer.documents import Documents  # noqa: E402


class LargestTensor(TorchDispatchMode):
    """The element count of the largest tensor any op returns while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def segments(seq, mean, seed):
    gen = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < seq:
        n = max(1, int(torch.empty(1).exponential_(1 / mean, generator=gen)))
        lengths.append(min(n, seq - total))
        total += lengths[-1]
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None], len(lengths)


def paths(docs, scale, device="cpu", dtype=torch.float32):
    out = {"packed (segmented)": lambda q, k, v: document_attention.segmented(q, k, v, docs, 0.0, scale)}
    if document_attention.select("auto", device, dtype) == "varlen":
        out["packed (varlen)"] = lambda q, k, v: document_attention.varlen(q, k, v, docs, 0.0, scale)
    out["dense mask"] = lambda q, k, v: sdpa(q, k, v, docs.dense_mask(), 0.0)
    out["causal (no documents)"] = lambda q, k, v: sdpa(q, k, v, None, 0.0)
    return out


def run(fn, q, k, v):
    out = fn(q, k, v)
    out.sum().backward()


def bench(seq, mean, args):
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    segs, n_docs = segments(seq, mean, args.seed)
    docs = Documents(segs.to(dev))
    gen = torch.Generator().manual_seed(args.seed)
    q, k, v = (torch.randn(seq, 1, n, args.head_dim, generator=gen).to(dev, dtype).requires_grad_()
               for n in (args.heads, args.groups, args.groups))
    fns = paths(docs, args.head_dim ** -0.5, dev, dtype)
    times, largest = {name: [] for name in fns}, {}
    for name, fn in fns.items():
        if name == "dense mask" and seq > args.max_dense:
            continue
        with LargestTensor() as mode:  # also the warm-up
            run(fn, q, k, v)
        largest[name] = mode.largest
    for r in range(args.rounds):
        order = list(largest) if r % 2 == 0 else list(reversed(list(largest)))
        for name in order:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(fns[name], q, k, v)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    rows = []
    for name in fns:
        if name not in largest:
            rows.append((seq, mean, n_docs, name, None, None))
            continue
        rows.append((seq, mean, n_docs, name, statistics.median(times[name]) * 1e3, largest[name] / seq ** 2))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--means", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-dense", type=int, default=1 << 30, help="skip the dense mask above this length")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="bench/results/packing_cpu.md")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    lines = [f"# Packed-document attention ({a.device}, {a.dtype}, {platform.processor() or platform.machine()}, "
             f"torch {torch.__version__}, {torch.get_num_threads()} threads)", "",
             f"b 1, {a.heads} heads ({a.groups} K/V groups) of {a.head_dim}; forward + backward of the attention core, "
             f"median of {a.rounds} rounds; largest tensor: the largest op output (forward or backward) in units of "
             "s^2 elements (python bench/packing.py " + " ".join(argv if argv is not None else sys.argv[1:]) + ")", "",
             "| seq | mean doc | documents | path | ms | largest tensor / s^2 |", "|---|---|---|---|---|---|"]
    for seq in a.seqs:
        for mean in a.means:
            for seq_, mean_, n, name, ms, big in bench(seq, mean, a):
                cells = ("not run (--max-dense)", "") if ms is None else (f"{ms:.1f}", f"{big:.3f}")
                lines.append(f"| {seq_} | {mean_} | {n} | {name} | {cells[0]} | {cells[1]} |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if not a.no_write:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
