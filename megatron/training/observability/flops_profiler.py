"""--flops-profiler-step N (this project's flag; DeepSpeed's flops profiler): iteration N measured module
by module (flops_counter.ModuleFlops), then the logging rank prints a table of its modules, TensorBoard
gets each module's achieved TFLOP/s and time, and --log-metrics-jsonl one record of the metrics rank's
table. Every rank counts its own share; their sum is compared with flops.py's model FLOPs of the step
(they are equal unless ranks repeat work, e.g. an MoE router computed on every TP rank). docs/observability.md.
"""
import contextlib
import time

import torch
import torch.distributed as dist

from .flops_counter import ModuleFlops
from .log import is_logging_rank


class FlopsProfiler:
    """step(i) wraps iteration i's train_step; report(...) after it. A no-op but at --flops-profiler-step."""

    def __init__(self, train_cfg, model, groups, device):
        self.at, self.model, self.groups, self.device = train_cfg.flops_profiler_step, model, groups, device
        self.measured = None
        if self.at is not None and groups.rank == 0:
            clock = "CUDA events per op" if device.type == "cuda" else "the CPU clock per op"
            print(f"> flops profiler: iteration {self.at}, every module's FLOPs (matrix products and attention) "
                  f"and time ({clock}); the table on the logging rank (rank {groups.world_size - 1})", flush=True)

    @contextlib.contextmanager
    def step(self, iteration):
        if iteration != self.at:
            yield
            return
        root = type(self.model).__name__
        with ModuleFlops(self.model, self.device, root) as measured:
            started = time.perf_counter()
            yield
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.seconds = time.perf_counter() - started
        self.measured = measured

    def report(self, iteration, model_flops, writers, metrics):
        """At the profiled iteration: the table, scalars and record. model_flops: flops.py's for its batch.
        Collective over the world (the ranks' totals are summed)."""
        if self.measured is None or iteration != self.at:
            return
        m, self.measured = self.measured, None
        rows = table_rows(m, self.seconds)
        mine = sum(m.total_flops[k] for k in ("forward", "backward"))
        total = torch.tensor([mine], dtype=torch.float64, device=self.device)
        if self.groups.world_size > 1:
            dist.all_reduce(total)  # float64 holds these sums exactly (below 2^53)
        summary = {"iteration": iteration, "rank": self.groups.rank, "step_seconds": self.seconds,
                   "rank_flops": mine, "recompute_flops": m.total_flops["recompute"],
                   "world_flops": int(total.item()), "model_flops": int(model_flops)}
        if is_logging_rank():
            print("\n".join(format_table(rows, summary, self.groups.world_size)), flush=True)
            for row in rows:
                writers.add(f"flops-profiler/{row['module']} TFLOP/s", row["tflops"], iteration)
                writers.add(f"flops-profiler/{row['module']} time-ms", 1e3 * row["seconds"], iteration)
            writers.add("flops-profiler/total TFLOP/s", mine / self.seconds / 1e12, iteration)
        metrics.record({"type": "flops_profile", **summary, "modules": rows})


def table_rows(measured, step_seconds):
    """One dict per module that holds parameters or ran FLOPs, in the model's order."""
    params, rows = measured.parameters(), []
    for path, count in params.items():
        flops = measured.flops.get(path, {})
        seconds = measured.seconds.get(path, {})
        fwd, bwd, rec = (flops.get(k, 0) for k in ("forward", "backward", "recompute"))
        if not (count or fwd or bwd or rec):
            continue
        busy = sum(seconds.values())
        rows.append({"module": path, "params": count, "forward_flops": fwd, "backward_flops": bwd,
                     "recompute_flops": rec, "forward_seconds": seconds.get("forward", 0.0),
                     "backward_seconds": seconds.get("backward", 0.0) + seconds.get("recompute", 0.0),
                     "seconds": busy, "tflops": (fwd + bwd) / busy / 1e12 if busy else 0.0,
                     "step_share": busy / step_seconds if step_seconds else 0.0})
    return rows


def _si(n):
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:g}"


def format_table(rows, summary, world_size):
    """The printed lines: a header, one line per module, the totals and how they meet the model FLOPs."""
    width = max([len(r["module"]) for r in rows] + [6])
    head = (f"{'module':<{width}}  {'params':>8}  {'fwd FLOPs':>9}  {'bwd FLOPs':>9}  {'fwd ms':>8}  {'bwd ms':>8}  "
            f"{'TFLOP/s':>8}  {'step %':>6}")
    lines = [f"> flops profiler, iteration {summary['iteration']}, rank {summary['rank']} (step "
             f"{1e3 * summary['step_seconds']:.1f} ms; a module's figures include its children's):", head]
    for r in rows:
        lines.append(f"{r['module']:<{width}}  {_si(r['params']):>8}  {_si(r['forward_flops']):>9}  "
                     f"{_si(r['backward_flops']):>9}  {1e3 * r['forward_seconds']:>8.2f}  "
                     f"{1e3 * r['backward_seconds']:>8.2f}  {r['tflops']:>8.4f}  {100 * r['step_share']:>6.1f}")
    s = summary
    lines.append(f"> flops profiler: this rank {s['rank_flops']} FLOPs ({_si(s['rank_flops'])}, "
                 f"{s['rank_flops'] / s['step_seconds'] / 1e12:.4f} TFLOP/s over the step); all {world_size} "
                 f"ranks {s['world_flops']}; flops.py's model FLOPs of the step {s['model_flops']}"
                 + _difference(s))
    if s["recompute_flops"]:
        lines.append(f"> flops profiler: activation recompute ran {s['recompute_flops']} more FLOPs on this rank "
                     "(hardware FLOPs, not model FLOPs: in the backward columns' times, not in their FLOPs)")
    return lines


def _difference(s):
    extra = s["world_flops"] - s["model_flops"]
    if extra == 0:
        return " (equal)"
    if extra > 0:
        return f" ({extra} more: work repeated on several ranks, e.g. a router or projection each TP rank runs whole)"
    return f" ({-extra} fewer: ops this counter does not know, e.g. a custom attention kernel)"
