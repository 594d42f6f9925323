"""What the iteration flush costs ZB-H2: the same measured runs read two ways.

    PYTHONPATH=. python bench/zb_flush.py --pp 4 --microbatches 8 16

Runs bench/pipeline_bubble.py's sleeping stages (forward = B = W = --stage-ms per stage) on the real
executor over gloo and reads each run's action spans twice:
  flushed    one iteration as training runs it: every rank waits for the slowest before the optimizer
             step, so the period is the makespan and idle = 1 - busy / makespan;
  overlapped every rank starting its next iteration as soon as its own last action ended (what the
             paper's optimizer post-validation allows; not built here): the period is the longest
             per-rank window (first compute start to last action end), idle = 1 - busy / that.
The simulator's figures (its `bubble` and `steady_idle`) are printed beside. ZB-H2's advantage is
1F1B's flushed idle minus ZB-H2's overlapped idle; the flush takes back ZB-H2's flushed minus
overlapped idle of it.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

COMPUTE = ("F", "B", "W")


def _periods(spans):
    """(flushed period, overlapped period, busy time of the busiest rank) of {rank: [(kind, chunk, mb,
    start, end)]}."""
    t0 = min(s[3] for ss in spans.values() for s in ss)
    t1 = max(s[4] for ss in spans.values() for s in ss)
    busy = {r: sum(e - s for k, _, _, s, e in ss if k in COMPUTE) for r, ss in spans.items()}
    window = {r: max(s[4] for s in ss) - min(s[3] for s in ss if s[0] in COMPUTE) for r, ss in spans.items()}
    return t1 - t0, max(window.values()), max(busy.values())


def main():
    from pipeline_bubble import ZB, _body

    from megatron.core.pipeline_parallel.schedules import build_schedule
    from megatron.core.pipeline_parallel.simulator import fbw_costs, simulate
    from tests.harness import spawn
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--schedules", nargs="+", default=["1f1b", "zb_h1", "zb_h2"])
    ap.add_argument("--stage-ms", type=float, default=150.0)
    ap.add_argument("--repeats", type=int, default=3, help="runs per point; the median-makespan run is read")
    a = ap.parse_args()
    P, stage_s = a.pp, a.stage_ms / 1000
    configs = [(M, 1, name) for name in a.schedules for M in a.microbatches]
    load = os.getloadavg()[0]
    runs = spawn(P, _body, configs, stage_s, "sleep", a.repeats, pp=P, timeout=1800)[0]
    print(f"P={P}, stages sleep {a.stage_ms:g} ms (F = B = W), median of {a.repeats}, "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| M | schedule | flushed idle % (sim) | overlapped idle % (sim) | flushed ms | overlapped ms |")
    print("|---|---|---|---|---:|---:|")
    for M, V, name in configs:
        reads = sorted(_periods({r: [tuple(x) for x in tr] for r, (tr, _) in enumerate(t)}) for t in runs[(M, V, name)])
        flushed, overlapped, busy = reads[len(reads) // 2]
        sim = simulate(build_schedule(P, M, V, name), fbw_costs(stage_s, stage_s, stage_s, split=name in ZB))
        steady = sim.steady_idle / (sim.steady_idle + 3 * M * stage_s)
        print(f"| {M} | {name} | {100 * (1 - busy / flushed):.2f} ({100 * sim.bubble:.2f}) | "
              f"{100 * (1 - busy / overlapped):.2f} ({100 * steady:.2f}) | {1000 * flushed:.0f} | "
              f"{1000 * overlapped:.0f} |", flush=True)


if __name__ == "__main__":
    main()
