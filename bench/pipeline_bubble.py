"""Pipeline bubble, measured: the real schedule executor over gloo against theory.

    PYTHONPATH=. python bench/pipeline_bubble.py                  # P 2 and 4, M 4 8 16, 1F1B and interleaved (V 2)
    PYTHONPATH=. python bench/pipeline_bubble.py --pp 2 --work matmul --append
    PYTHONPATH=. python bench/pipeline_bubble.py --pp 4 --microbatches 8 --schedules 1f1b interleaved_1f1b zb_h1 zb_h2

Every rank runs megatron.core.pipeline_parallel.forward_backward (the executor training
uses, with real batch_isend_irecv between processes) on model chunks whose forward takes
`--stage-ms` per stage and backward twice that, split evenly over the V chunks (the zero-bubble
schedules run half of the backward as B and half as W, the paper's F = B = W). A rank's
idle fraction is 1 - (time inside its forward and backward actions) / makespan, the
makespan running from the first action's start to the last action's end over all ranks
(time.perf_counter: one clock for all processes of one machine). Theory, for uniform
stages and free communication: (P - 1) / (M + P - 1) for 1F1B, (P - 1) / (V M + P - 1)
interleaved; the simulator (simulator.py) gives exactly these figures for these schedules,
and its figure is the theory column for the zero-bubble ones. Activation memory: each
forward keeps a [SEQ, MICRO, HIDDEN x 16 / V] fp32 tensor for its backward (for W, where the
schedule splits it); the peak of those alive on a rank is reported.

Stage work is a sleep by default: it stands for accelerator compute, during which the host
waits. On this benchmark's 2 shared CPU cores, real CPU work in P processes competes for the
cores, so the measurement would show the OS scheduler, not the schedule; `--work matmul`
uses CPU matmuls anyway (meaningful with P <= free cores). Messages are [32, 1, 64] fp32
(8 KiB): communication is well under 1 ms against stages of tens of ms.
"""
import argparse
import datetime
import gc
import json
import os
import platform
import sys
import time
import weakref
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

SEQ, MICRO, HIDDEN = 32, 1, 64
ACT_ELEMS = SEQ * MICRO * HIDDEN * 16
ZB = ("zb_h1", "zb_h2", "zb_v")
_alive = [0, 0]  # activation tensors alive now, peak


def _activation(elems):
    t = torch.empty(elems)
    _alive[0] += 1
    _alive[1] = max(_alive[1], _alive[0])
    weakref.finalize(t, _freed)
    return t


def _freed():
    _alive[0] -= 1


def _work(seconds, kind):
    if kind == "sleep":
        time.sleep(seconds)
        return
    a = torch.randn(96, 96)
    end = time.perf_counter() + seconds  # busy CPU until the stage's time is spent
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


class _BackwardWork(torch.autograd.Function):
    """Backward: `seconds` of input-gradient work where the running backward wants x's gradient,
    `w_seconds` of weight-gradient work where it wants the weight's: a zero-bubble B and W
    (pipeline_parallel/backward_split.py) each run their half, an ordinary backward both. Without an
    input gradient (the first stage) the split's W runs both halves, as it runs a real first stage's
    whole backward."""

    @staticmethod
    def forward(ctx, x, weight, seconds, w_seconds, kind, act_elems):
        ctx.seconds, ctx.w_seconds, ctx.kind = seconds, w_seconds, kind
        ctx.act = _activation(act_elems)  # what the backward (or W) of this microbatch holds on to
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        from megatron.core.backward_needs import needs_grad
        wants_x, wants_w = needs_grad(ctx, 0), needs_grad(ctx, 1)
        _work((ctx.seconds if wants_x or not ctx.needs_input_grad[0] else 0.0)
              + (ctx.w_seconds if wants_w else 0.0), ctx.kind)
        gw = torch.zeros(()) * ctx.act[0] if wants_w else None
        if wants_w:
            del ctx.act
        return (grad if wants_x else None), gw, None, None, None, None


class Stage(nn.Module):
    """A model chunk with a fixed cost: forward `fwd` seconds, backward `bwd` seconds."""

    def __init__(self, fwd, bwd, pre, post, kind, V, v_shape=False):
        super().__init__()
        self.config = SimpleNamespace(hidden_size=HIDDEN, sequence_parallel=False, params_dtype=torch.float32,
                                     pipeline_v_layout=v_shape)
        self.weight = nn.Parameter(torch.ones(()))
        self.fwd, self.bwd, self.pre, self.post, self.kind = fwd, bwd, pre, post, kind
        self.act_elems = ACT_ELEMS // V  # a chunk holds 1/V of the stage's layers
        self.input_tensor = None

    def set_input_tensor(self, tensor):
        self.input_tensor = tensor

    def forward(self, tokens):
        x = torch.ones(tokens.shape[1], tokens.shape[0], HIDDEN) if self.pre else self.input_tensor
        _work(self.fwd, self.kind)
        y = _BackwardWork.apply(x, self.weight, self.bwd / 2, self.bwd / 2, self.kind, self.act_elems)
        return y.sum(-1).t() if self.post else y  # "per-token loss" [b, s] on the last stage


def _forward_step(model, batch):
    out = model(batch["tokens"])
    return {"lm loss": (out, batch["loss_mask"])} if model.post else out


def _one_run(groups, P, M, V, name, stage_s, kind):
    from megatron.core.pipeline_parallel import forward_backward
    v_shape = name == "zb_v"  # the loss on rank 0's chunk 1
    last = groups.is_first_stage if v_shape else groups.is_last_stage
    chunks = [Stage(stage_s / V, 2 * stage_s / V, groups.is_first_stage and v == 0, last and v == V - 1, kind, V,
                    v_shape) for v in range(V)]
    batches = [{"tokens": torch.zeros(MICRO, SEQ, dtype=torch.long), "loss_mask": torch.ones(MICRO, SEQ)}] * M
    trace = []
    dist.barrier()
    _alive[1] = _alive[0]
    forward_backward(chunks, batches, _forward_step, groups, trace=trace, schedule=name)
    traces = [None] * P
    dist.all_gather_object(traces, (trace, _alive[1]))
    return traces


def _body(groups, configs, stage_s, kind, repeats):
    from megatron.core.parallel_state import add_pipeline_grad_group
    add_pipeline_grad_group(groups)  # zb_v's gradient channel
    for cfg in configs:  # warm up connections and first-call paths
        _one_run(groups, groups.pp_size, *cfg, 0.001, "sleep")
    gc.collect()
    out = {cfg: [] for cfg in configs}
    for _ in range(repeats):  # rounds over all points, so a burst of load hits one run of each at most
        for cfg in configs:
            out[cfg].append(_one_run(groups, groups.pp_size, *cfg, stage_s, kind))
    return out


def main():
    from pipeline_timeline import bubble, write

    from megatron.core.pipeline_parallel.schedules import build_schedule
    from megatron.core.pipeline_parallel.simulator import fbw_costs, loop_stage, simulate, v_stage
    from megatron.core.pipeline_parallel.zb_v import zb_v
    from tests.harness import spawn
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--vpp", type=int, default=2, help="model chunks per rank of the interleaved schedule")
    ap.add_argument("--schedules", nargs="+", default=["1f1b", "interleaved_1f1b"],
                    choices=["1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zb_v"])
    ap.add_argument("--stage-ms", type=float, default=150.0, help="one stage's forward; backward is twice it")
    ap.add_argument("--work", choices=["sleep", "matmul"], default="sleep")
    ap.add_argument("--repeats", type=int, default=5, help="runs per point; the median-makespan run is reported")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pipeline_bubble.md"))
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--timeline", nargs="*", default=["4,8,1", "4,8,2"],
                    help="P,M,V points whose recorded (reported) run is also drawn (SVG + JSON trace)")
    a = ap.parse_args()
    stage_s = a.stage_ms / 1000
    load_start = os.getloadavg()[0]
    rows, worst, draw = [], 0.0, {tuple(int(x) for x in t.split(",")) for t in a.timeline}
    for P in a.pp:
        chunks = {"interleaved_1f1b": a.vpp, "zb_v": 2}
        configs = [(M, chunks.get(name, 1), name) for name in a.schedules
                   for M in a.microbatches if name != "interleaved_1f1b" or M % P == 0]
        runs = spawn(P, _body, configs, stage_s, a.work, a.repeats, pp=P, timeout=1800)[0]
        for (M, V, name), reps in runs.items():
            measured = []
            for traces in reps:
                spans = {r: [tuple(x) for x in tr] for r, (tr, _) in enumerate(traces)}
                measured.append((bubble(spans), spans, [peak for _, peak in traces]))
            (idle, makespan), spans, peaks = sorted(measured, key=lambda m: m[0][1])[len(measured) // 2]
            v = name == "zb_v"
            acts = {r: zb_v(P, M, V, r) for r in range(P)} if v else build_schedule(P, M, V, name)
            sim = simulate(acts, fbw_costs(stage_s, stage_s, stage_s, V=V, split=name in ZB),
                           stage_of=v_stage if v else loop_stage, streams=v)
            theory = sim.bubble
            dev = max(abs(i - theory) for i in idle.values())
            worst = max(worst, dev)
            ideal = sim.makespan
            mib = ACT_ELEMS // V * 4 / 2**20
            rows.append(f"| {P} | {V} | {M} | {name} | {100 * theory:.2f} | "
                        + " / ".join(f"{100 * idle[r]:.2f}" for r in sorted(idle))
                        + f" | {100 * dev:.2f} | {1000 * makespan:.0f} | {1000 * ideal:.0f} | "
                        + " / ".join(f"{n * mib:.1f}" for n in peaks) + " |")
            print(rows[-1], flush=True)
            if (P, M, V) in draw:
                tag = f"_{name}" if name in ZB else ""
                stem = os.path.join(os.path.dirname(a.out), f"pipeline_timeline_p{P}_m{M}_v{V}{tag}")
                title = f"{name} recorded: P={P} M={M} V={V}, {a.work} stages of {a.stage_ms:g} ms forward"
                write(spans, title, stem + ".svg")
                with open(stem + ".json", "w") as f:
                    json.dump({"schedule": name, "P": P, "M": M, "V": V, "ranks": spans}, f)
                print(f"wrote {stem}.svg and .json", flush=True)
    ok = "OK" if worst <= 0.02 else "MISSED"
    text = "\n".join([
        "# Pipeline bubble: measured idle fraction per rank vs theory", "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- command: `PYTHONPATH=. python bench/pipeline_bubble.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"- torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPU cores, gloo; "
        f"load average (1 min) {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end (other jobs share the cores)",
        f"- stage work: {a.work}, forward {a.stage_ms:g} ms per stage, backward {2 * a.stage_ms:g} ms "
        f"(each of V chunks 1/V of it); messages [{SEQ}, {MICRO}, {HIDDEN}] fp32; "
        f"median-makespan run of {a.repeats}",
        "- theory: the simulator's idle fraction (F = B = W = stage ms; for 1F1B and interleaved it is "
        "(P-1)/(M+P-1) and (P-1)/(V M+P-1)); idle = 1 - compute time / makespan",
        f"- activation MiB per rank: peak of the [{SEQ}, {MICRO}, {HIDDEN} x 16 / V] fp32 tensors each forward keeps "
        "until its backward (or W) ran", "",
        "| P | V | M | schedule | theory % | measured idle % per rank | max deviation (pp) | makespan ms | ideal ms "
        "| peak activation MiB per rank |",
        "|---|---|---|---|---:|---|---:|---:|---:|---|", *rows, "",
        f"**largest deviation from theory: {100 * worst:.2f} percentage points; target <= 2: {ok}**", ""])
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "a" if a.append else "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
