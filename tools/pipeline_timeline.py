"""Draw a pipeline schedule as a per-rank Gantt chart (SVG, or PNG with matplotlib) and print its bubble.

    # a simulated schedule (uniform stage costs: forward 1, backward 2, per chunk 1/V of that)
    python tools/pipeline_timeline.py --schedule 1f1b --pp 4 --microbatches 8 -o 1f1b.svg
    python tools/pipeline_timeline.py --schedule interleaved_1f1b --pp 4 --microbatches 8 --vpp 2 -o il.svg
    # zero-bubble: the backward's weight-gradient part (--weight-cost, of --backward-cost) runs as W
    python tools/pipeline_timeline.py --schedule zb_h1 --pp 4 --microbatches 8 -o zb_h1.svg
    # a recorded run (bench/pipeline_bubble.py --trace-dir writes these)
    python tools/pipeline_timeline.py --trace bench/results/pipeline_trace_p4_m8_v1.json -o run.svg

Trace files are JSON: {"schedule", "P", "M", "V", "ranks": {rank: [[kind, chunk, mb, start, end], ...]}}
with kind F, B, W or comm and times in seconds on one clock (time.perf_counter of one machine).
The bubble of a rank is the fraction of the makespan (first start to last end, over all
ranks) in which it does not compute; communication counts as idle.
"""
import argparse
import json
import os
import sys
from html import escape

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

F_COLORS = ["#4c78a8", "#72b7b2", "#9ecae9", "#54a24b"]   # forward, by model chunk
B_COLORS = ["#f58518", "#e45756", "#ff9da6", "#eeca3b"]   # backward (input gradient), by model chunk
W_COLORS = ["#2ca02c", "#98df8a", "#8c6d31", "#bcbd22"]   # weight gradients (zero-bubble W), by model chunk
COLORS = {"F": F_COLORS, "B": B_COLORS, "W": W_COLORS}


def spans_from_simulation(timeline):
    """simulator.Timeline -> {rank: [(kind, chunk, mb, start, end)]}."""
    return {r: [(a.kind, a.chunk, a.mb, s, e) for s, e, a in spans] for r, spans in timeline.spans.items()}


def bubble(spans):
    """({rank: idle fraction}, makespan) of {rank: [(kind, chunk, mb, start, end)]}."""
    t0 = min(s[3] for ss in spans.values() for s in ss)
    t1 = max(s[4] for ss in spans.values() for s in ss)
    makespan = t1 - t0
    idle = {r: 1.0 - sum(e - s for k, _, _, s, e in ss if k in COLORS) / makespan for r, ss in spans.items()}
    return idle, makespan


def render_svg(spans, title, width=1100, row=30):
    """SVG text: one row per rank, a box per forward (blue) / backward (orange) / W (green) labelled with its
    microbatch, shades by model chunk, communication as a thin grey bar, idle time blank."""
    t0 = min(s[3] for ss in spans.values() for s in ss)
    idle, makespan = bubble(spans)
    left, right, top, gap = 70, 52, 44, 8
    scale = (width - left - right) / makespan
    ranks = sorted(spans, key=int)
    height = top + len(ranks) * (row + gap) + 46
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>',
           f'<text x="{left}" y="36" fill="#555">mean bubble {100 * sum(idle.values()) / len(idle):.1f}% '
           f'of {makespan:.4g} s; idle per rank at the right</text>']
    for i, r in enumerate(ranks):
        y = top + i * (row + gap)
        out.append(f'<rect x="{left}" y="{y}" width="{width - left - right}" height="{row}" fill="#f2f2f2"/>')
        out.append(f'<text x="8" y="{y + row / 2 + 4}">rank {r}</text>')
        for kind, chunk, mb, s, e in spans[r]:
            x, w = left + (s - t0) * scale, max((e - s) * scale, 0.5)
            if kind == "comm":
                out.append(f'<rect x="{x:.2f}" y="{y + row - 4}" width="{w:.2f}" height="3" fill="#999"/>')
                continue
            color = COLORS[kind][chunk % 4]
            out.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row - 8}" fill="{color}" '
                       f'stroke="white" stroke-width="0.5"><title>{kind} chunk {chunk} microbatch {mb}: '
                       f'{s - t0:.4g}-{e - t0:.4g} s</title></rect>')
            if w > 14:
                out.append(f'<text x="{x + w / 2:.2f}" y="{y + row / 2 + 2}" text-anchor="middle" '
                           f'fill="white">{mb}</text>')
        out.append(f'<text x="{width - 8}" y="{y + row / 2 + 4}" text-anchor="end" fill="#333" '
                   f'font-size="10">{100 * idle[r]:.1f}%</text>')
    y = top + len(ranks) * (row + gap) + 14
    chunks = sorted({c for ss in spans.values() for k, c, *_ in ss if k in COLORS})
    kinds = {k for ss in spans.values() for k, *_ in ss}
    x = left
    for kind, colors, name in (("F", F_COLORS, "forward"), ("B", B_COLORS, "backward"),
                               ("W", W_COLORS, "weight gradients")):
        if kind not in kinds:
            continue
        for c in chunks:
            out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colors[c % 4]}"/>')
            label = f"{name}" + (f" chunk {c}" if len(chunks) > 1 else "")
            out.append(f'<text x="{x + 16}" y="{y + 10}">{label}</text>')
            x += 30 + 6 * len(label)
    out.append(f'<rect x="{x}" y="{y + 5}" width="12" height="3" fill="#999"/>'
               f'<text x="{x + 16}" y="{y + 10}">send/recv, waiting included</text>')
    out.append(f'<text x="{left}" y="{y + 28}" fill="#555">time -&gt; (numbers: microbatch)</text></svg>')
    return "\n".join(out)


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("error: PNG output needs matplotlib, which is not installed; write an .svg instead") from None
    return plt


def write(spans, title, path):
    """Write an .svg (always available) or .png (needs matplotlib)."""
    if path.endswith(".png"):
        plt = _pyplot()
        t0 = min(s[3] for ss in spans.values() for s in ss)
        ranks = sorted(spans, key=int)
        fig, ax = plt.subplots(figsize=(12, 0.5 * len(ranks) + 1))
        for i, r in enumerate(ranks):
            for kind, chunk, _mb, s, e in spans[r]:
                if kind != "comm":
                    ax.broken_barh([(s - t0, e - s)], (i - 0.4, 0.8),
                                   color=COLORS[kind][chunk % 4])
        ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
        ax.invert_yaxis()
        ax.set_xlabel("time (s)")
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        return
    with open(path, "w") as f:
        f.write(render_svg(spans, title))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--schedule", choices=["no_pipelining", "gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2",
                                                  "zb_v"])
    src.add_argument("--trace", help="JSON trace recorded from a run")
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--vpp", type=int, default=1, help="model chunks per rank")
    ap.add_argument("--forward-cost", type=float, default=1.0, help="one stage's forward (all its chunks)")
    ap.add_argument("--backward-cost", type=float, default=2.0, help="the whole backward: B and W")
    ap.add_argument("--weight-cost", type=float, default=1.0,
                    help="the weight-gradient part of --backward-cost, run as W by the zb_* schedules")
    ap.add_argument("--comm-cost", type=float, default=0.0, help="per send/recv step")
    ap.add_argument("-o", "--output", default="pipeline_timeline.svg", help=".svg or .png")
    a = ap.parse_args(argv)
    if a.output.endswith(".png"):
        _pyplot()  # fail before any work
    if a.trace:
        with open(a.trace) as f:
            tr = json.load(f)
        spans = {int(r): [tuple(x) for x in ss] for r, ss in tr["ranks"].items()}
        title = f"{tr['schedule']} recorded: P={tr['P']} M={tr['M']} V={tr['V']}"
    else:
        from megatron.core.pipeline_parallel.schedules import ScheduleError, build_schedule
        from megatron.core.pipeline_parallel.simulator import fbw_costs, predicted_bubble, simulate, v_stage
        from megatron.core.pipeline_parallel.zb_v import zb_v
        v_shape = a.schedule == "zb_v"  # two chunks per rank in a V; activations and grads on their own channels
        try:
            ratio = (a.forward_cost, a.backward_cost - a.weight_cost, a.weight_cost)  # the order ZB-V is found for
            actions = ({r: zb_v(a.pp, a.microbatches, 2, r, costs=ratio) for r in range(a.pp)} if v_shape
                       else build_schedule(a.pp, a.microbatches, a.vpp, a.schedule))
        except ScheduleError as e:
            raise SystemExit(f"error: {e}") from None
        a.vpp = 2 if v_shape else a.vpp
        costs = fbw_costs(a.forward_cost, a.backward_cost - a.weight_cost, a.weight_cost, a.comm_cost, a.vpp,
                          split=a.schedule.startswith("zb"))
        timeline = (simulate(actions, costs, stage_of=v_stage, streams=True) if v_shape
                    else simulate(actions, costs))
        spans = spans_from_simulation(timeline)
        print("peak microbatches in flight per rank (forwarded, backward (or W) not yet run; counted per chunk): "
              + ", ".join(f"{r}: {n}" for r, n in sorted(timeline.peak_in_flight.items())))
        title = f"{a.schedule} simulated: P={a.pp} M={a.microbatches} V={a.vpp}"
        if a.schedule.startswith("zb"):
            print(f"idle between overlapping iterations (Timeline.steady_idle): {timeline.steady_idle:.4g}")
        elif a.schedule != "gpipe" or a.vpp == 1:
            v = a.vpp if a.schedule != 'gpipe' else 1
            print(f"theory (P-1)/(V M+P-1): {100 * predicted_bubble(a.pp, a.microbatches, v):.2f}%")
    write(spans, title, a.output)
    idle, makespan = bubble(spans)
    for r in sorted(idle):
        print(f"rank {r}: idle {100 * idle[r]:.2f}%")
    print(f"bubble (mean idle fraction): {100 * sum(idle.values()) / len(idle):.2f}% of makespan {makespan:.4g}")
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
