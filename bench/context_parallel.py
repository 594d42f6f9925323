"""Context parallelism on CPU (gloo): saved activations per layer per rank, and ring vs all_gather.

    python bench/context_parallel.py                 # seq 1K..16K at CP 1/2/4; timing at CP2
    python bench/context_parallel.py --seqs 1024 2048 --rounds 3 --no-write

1. Saved-activation bytes of one transformer layer's forward on one rank (storages autograd keeps
   for backward, parameters excluded; tests/activation_memory.measure) for each sequence length at
   CP 1, 2 and 4: they must fall as 1/C. CP 1 runs torch SDPA (its CPU flash kernel keeps no s x s
   tensor either), so the ratio is the sequence split alone.
2. At CP 2: forward + backward time of the layer with --cp-comm-type p2p (ring) against all_gather,
   alternating A B / B A, median over rounds; and the bytes each rank hands to send / receive per
   step (counted where our code posts them) against the formula, with u = one rank's K and V,
   2 (s / C) b g d x 4 bytes (fp32, g K/V heads of size d):
     ring:        forward (C-1) u, backward (C-1) u of K/V plus C u of dK/dV (sent home)
     all_gather:  forward all-gather (C-1) u, backward reduce-scatter (C-1) u
   (collectives counted as a ring algorithm moves them: (C-1)/C of the gathered / reduced tensor).
"""
import argparse
import datetime
import functools
import os
import platform
import queue
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core import comm
from megatron.core.config import TransformerConfig
from megatron.core.parallel_state import initialize_model_parallel
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.param_meta import set_init_key
from megatron.core.transformer import context_parallel, ring_attention
from megatron.core.transformer.layer import TransformerLayer
from tests.activation_memory import measure

SENT = {"bytes": 0}


def _count(fn, share):
    """Wrap a comm function so that SENT counts share(tensor, group) bytes per call."""
    def wrapped(*args, **kwargs):
        SENT["bytes"] += share(*args)
        return fn(*args, **kwargs)
    return wrapped


def _instrument():
    ring = ring_attention._Ring
    ring.start = _count(ring.start, lambda self, t, *rest: t.numel() * t.element_size())
    ag = lambda x, group: (comm.world(group) - 1) * x.numel() * x.element_size()  # noqa: E731
    rs = lambda x, group: (comm.world(group) - 1) * x.numel() * x.element_size() // comm.world(group)  # noqa: E731
    context_parallel.comm = type("comm", (), {
        "all_gather_dim0": staticmethod(_count(comm.all_gather_dim0, ag)),
        "reduce_scatter_dim0": staticmethod(_count(comm.reduce_scatter_dim0, rs)),
        "world": staticmethod(comm.world), "rank": staticmethod(comm.rank)})


def _layer(a, groups, comm_type, seq):
    cfg = TransformerConfig(num_layers=1, hidden_size=a.hidden, num_attention_heads=a.heads, seq_length=seq,
                            vocab_size=128, hidden_dropout=0.0, attention_dropout=0.0,
                            context_parallel_size=groups.cp_size, cp_comm_type=comm_type)
    layer = TransformerLayer(cfg, groups, 1)
    for name, param in layer.named_parameters():
        set_init_key(param, name)  # the same values on every rank and at every CP size
    initialize_parameters(layer, 1, 0, 1)
    return layer


def _worker(rank, a, cp, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=cp)
    groups = initialize_model_parallel(1, 1, None, cp)
    _instrument()
    result = {"memory": {}, "time": {}, "bytes": {}}
    for seq in a.seqs:
        layer = _layer(a, groups, "p2p", seq)
        x = torch.randn(seq // cp, a.micro_batch, a.hidden, requires_grad=True)
        _, saved = measure(functools.partial(layer, x), exclude=list(layer.parameters()))
        result["memory"][seq] = saved
    if cp == 2:
        for seq in a.time_seqs:
            layers = {c: _layer(a, groups, c, seq) for c in ("p2p", "all_gather")}
            x = torch.randn(seq // cp, a.micro_batch, a.hidden)
            times = {c: [] for c in layers}
            for r in range(a.warmup + a.rounds):
                for c in (list(layers) if r % 2 == 0 else list(layers)[::-1]):
                    xi = x.clone().requires_grad_()
                    dist.barrier()
                    SENT["bytes"] = 0
                    t0 = time.perf_counter()
                    layers[c](xi).sum().backward()
                    if r >= a.warmup:
                        times[c].append(time.perf_counter() - t0)
                    result["bytes"][(seq, c)] = SENT["bytes"]
            result["time"][seq] = times
    if groups.rank == 0:
        out.put(result)
    dist.destroy_process_group()


def _run(a, cp):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = __import__("tests.harness", fromlist=["free_port"]).free_port()
    procs = [ctx.Process(target=_worker, args=(r, a, cp, port, out)) for r in range(cp)]
    for p in procs:
        p.start()
    while True:  # a rank that fails ends the bench instead of leaving it waiting
        try:
            result = out.get(timeout=5)
            break
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit(f"a CP {cp} rank failed (its traceback is above)") from None
    for p in procs:
        p.join()
    return result


def _formula(a, seq, cp, comm_type):
    """Bytes one rank sends per layer per step (see the module docstring); K/V heads = heads (no GQA)."""
    u = 2 * (seq // cp) * a.micro_batch * a.hidden * 4
    return (2 * (cp - 1) + cp) * u if comm_type == "p2p" else 2 * (cp - 1) * u


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--time-seqs", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--cps", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    results = {cp: _run(a, cp) for cp in a.cps}
    ratios = [c for c in a.cps if c > 1] if 1 in a.cps else []  # CP1 / CPc columns need CP 1
    mem = ["| seq | " + " | ".join([f"CP {c} bytes" for c in a.cps] + [f"CP1 / CP{c}" for c in ratios]) + " |",
           "|---:|" + "---:|" * (len(a.cps) + len(ratios))]
    for s in a.seqs:
        row = {c: results[c]["memory"][s] for c in a.cps}
        mem.append(f"| {s} | " + " | ".join([f"{v:,}" for v in row.values()] +
                                            [f"{row[1] / row[c]:.2f}" for c in ratios]) + " |")
    lines = ["### Saved activations per layer per rank (forward of one layer, fp32)", ""] + mem
    if 2 in results:
        r2 = results[2]
        lines += ["", "### CP 2: ring (p2p) vs all_gather, one layer forward + backward", "",
                  "| seq | p2p ms (median) | all_gather ms (median) | p2p / all_gather | p2p bytes sent | formula "
                  "| all_gather bytes | formula |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in a.time_seqs:
            med = {c: statistics.median(v) * 1000 for c, v in r2["time"][s].items()}
            lines.append(f"| {s} | {med['p2p']:.1f} | {med['all_gather']:.1f} | {med['p2p'] / med['all_gather']:.2f} "
                         f"| {r2['bytes'][(s, 'p2p')]:,} | {_formula(a, s, 2, 'p2p'):,} "
                         f"| {r2['bytes'][(s, 'all_gather')]:,} | {_formula(a, s, 2, 'all_gather'):,} |")
    table = "\n".join(lines)
    print(table)
    if not a.no_write:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "context_parallel_cpu.md")
        with open(path, "a") as f:
            f.write(f"\n## {datetime.date.today()} context parallelism on CPU (gloo)\n\n"
                    f"- command: `python {' '.join(sys.argv)}`\n- torch {torch.__version__}, python "
                    f"{platform.python_version()}, {os.cpu_count()} CPU cores (shared), {a.threads} thread per rank\n"
                    f"- layer: hidden {a.hidden}, {a.heads} heads, ffn {4 * a.hidden}, micro batch {a.micro_batch}, "
                    f"fp32; timing {a.rounds} rounds after {a.warmup} warm-up\n\n{table}\n")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
