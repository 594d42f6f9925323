"""--auto-parallel against measurement: every valid layout of a small GPT, trained on this machine.

    python bench/auto_parallel.py                         # 2 and 4 ranks on CPU (gloo), 1 thread per rank
    python bench/auto_parallel.py --ranks 2 --no-recompute --iters 8

For each world size: the planner ranks every layout of the model as --auto-parallel does (the CPU profile of
cpu_calibration.py, cached under --cache-dir), then each layout (--no-recompute: those without recompute,
plus the auto choice whatever it is) trains --iters iterations through torchrun; its step time is the
median of the progress lines' "elapsed time per iteration" after the first two. Reported: where the auto
choice ranks among the measured, its time against the best measured, and predicted vs measured per layout.
Writes the table to bench/results/auto_parallel_cpu.md (with the machine's load, as measured then).
"""
import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from megatron.core.datasets.index_cache import default_cache_root  # noqa: E402
from megatron.training.config.arguments import parse_args  # noqa: E402
from megatron.training.planner.auto_parallel import choose  # noqa: E402
from megatron.training.planner.cpu_calibration import cpu_cluster  # noqa: E402

MODEL = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024", "--num-layers", "4",
         "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128", "--global-batch-size", "8",
         "--lr", "1e-3", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7"]
ITER_MS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+)")


def measure(flags, nproc, iters, timeout=600) -> float | None:
    """Median ms per iteration of pretrain_gpt.py `flags` on nproc ranks (None: the run failed)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "pretrain_gpt.py", *flags, "--train-iters", str(iters), "--log-interval", "1", "--eval-iters", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    times = [float(ms) for it, ms in ITER_MS.findall(proc.stdout) if int(it) > 2]
    if proc.returncode != 0 or not times:
        print(f"  failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    return statistics.median(times)


def bench_world(nproc, iters, cache_dir, no_recompute):
    os.environ.update(WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
    cluster, source = cpu_cluster(nproc, nproc, cache_dir)
    argv = MODEL + ["--auto-parallel", "--data-cache-path", cache_dir]
    m, t = parse_args(argv)[:2]
    choice = choose(argv, m, t, cluster, source)
    auto = choice.best
    todo = [p for p in choice.ranked if p is auto or not (no_recompute and "rec=" in p.label)]
    rows = []
    for i, p in enumerate(todo):
        print(f"[{nproc} ranks {i + 1}/{len(todo)}] {p.label}", flush=True)
        ms = measure([a for a in p.flags if a != "--auto-parallel"], nproc, iters)
        if ms is not None:
            rows.append((p, ms))
    return choice, source, rows


def table(nproc, choice, source, rows) -> list[str]:
    by_time = sorted(rows, key=lambda r: r[1])
    best_ms = by_time[0][1]
    auto_ms = next((ms for p, ms in rows if p is choice.best), None)
    place = next((i + 1 for i, (p, _) in enumerate(by_time) if p is choice.best), None)
    out = [f"### {nproc} ranks: {len(choice.ranked)} valid layouts, {len(rows)} measured", "",
           f"Planned on {source}.", ""]
    if auto_ms is not None:
        out += [f"Auto choice **{choice.best.label}**: measured rank {place} of {len(rows)}, {auto_ms:.1f} ms "
                f"against the best measured {best_ms:.1f} ms ({by_time[0][0].label}): "
                f"{100 * (auto_ms / best_ms - 1):+.1f}%.", ""]
    out += ["| measured rank | layout | predicted ms | measured ms | measured / predicted | vs best | auto |",
            "|---:|---|---:|---:|---:|---:|:---:|"]
    for i, (p, ms) in enumerate(by_time):
        pred = 1e3 * p.step.total
        out.append(f"| {i + 1} | {p.label} | {pred:.2f} | {ms:.1f} | {ms / pred:.2f} | "
                   f"{100 * (ms / best_ms - 1):+.1f}% | {'yes' if p is choice.best else ''} |")
    return out + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--no-recompute", action="store_true", help="measure only layouts without recompute (and auto)")
    ap.add_argument("--cache-dir", default=os.path.join(default_cache_root(), "planner"),
                    help="where the CPU profile is cached (--auto-parallel's default place)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "auto_parallel_cpu.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # the ranks' thread count, so the profile is the one they would read
    load_before = os.getloadavg()
    lines = ["# --auto-parallel against measured step times (CPU, gloo)", "",
             f"`python bench/auto_parallel.py --ranks {' '.join(map(str, args.ranks))} --iters {args.iters}"
             f"{' --no-recompute' if args.no_recompute else ''}`, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}. "
             "Model: " + " ".join(MODEL), ""]
    body = []
    for n in args.ranks:
        body += table(n, *bench_world(n, args.iters, args.cache_dir, args.no_recompute))
    load_after = os.getloadavg()
    lines += [f"**The machine was shared and loaded while this ran** (1-minute load average {load_before[0]:.1f} at "
              f"the start, {load_after[0]:.1f} at the end, on {os.cpu_count()} cores): step times carry other "
              "users' noise; rerun on a quiet machine before reading small differences.", ""] + body
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
