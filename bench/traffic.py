"""CPU traffic budget: launches, bytes and GEMM FLOPs per aten op of one training step, ours vs plain.

    PYTHONPATH=. python bench/traffic.py                    # GPT 1.3B of issue 27, / 8, bf16
    PYTHONPATH=. python bench/traffic.py --check-scaling    # also at / 16: is bytes x k^2 exact?
    PYTHONPATH=. python bench/traffic.py --arch llama-1b --out bench/results/traffic_llama.md

One full step (every microbatch, the DDP grad hooks, clipping, the optimizer step, zero_grad) of
ours (bench/pair.py: GPTModel + DDP + MegatronOptimizer with fp32 main weights + train_step, world
of one) and of the plain loop (bench/plain_models.py, torch AdamW on the bf16 parameters), both in
bf16 as on the GPU, runs on the CPU under bench/op_traffic.py's dispatch mode at the GPU shape
with hidden (and ffn, head size), sequence and vocabulary divided by k (default 8); the step
counted is the second (the first allocates lazy optimizer state), after a first step whose token
losses must agree (same weights, same function).

Scaling to the GPU shape: every tensor of these models is [tokens or vocab or hidden] x [hidden or
vocab or head size] (matrices, activations, logits; heads, layers and batch are not scaled), so its
bytes scale by k^2; vectors (biases, norm weights, row statistics) by k and scalars not at all,
which this rule over-counts by a share of about 1/hidden. FLOPs scale by k^3; launches not at all
(but for multi-tensor launches, which grow with the elements). --check-scaling runs k and 2k and
prints both scaled totals. Predicted GPU time per op is its roofline: max(bytes / bandwidth, FLOPs /
matmul rate) at the given (measured, not datasheet) rates.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from bench import pair
from bench.op_traffic import OpCount, OpTraffic

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def count_step(groups, shape, dtype=torch.bfloat16, seed=1234, fake=False, options=None):
    """{"ours": {op: OpCount}, "plain": {op: OpCount}, "first": [(loss, grad norm) of ours, of plain]} for
    the second training step of each at `shape`, on the CPU in an initialised world of one.
    fake: run on FakeTensorMode tensors (shapes only, no arithmetic: the same ops and counts for a
    dense model, whose ops do not depend on values, in a tenth of the time; "first" is then None).
    options: ours' TransformerConfig options (pair.ours_config); None: Megatron-LM's defaults."""
    if fake:
        with FakeTensorMode(allow_non_fake_inputs=True):
            out = count_step(groups, shape, dtype, seed, options=options)
        out["first"] = None
        return out
    hp = pair.Hyper(seed=seed)
    ours = pair.Ours(shape, groups, "cpu", dtype, hp, options=options)
    plain = pair.Plain(shape, ours, "cpu", dtype, hp, optim="fused")
    batches = pair.make_batches(shape, seed, "cpu")
    # the first step (one microbatch is enough) allocates what is lazily allocated (AdamW's state)
    first = [step(batches[:1]) for step in (ours.step, plain.step)]
    first = None if isinstance(first[0][0], FakeTensor) else [tuple(float(x) for x in f) for f in first]
    out = {"first": first}
    for name, model in (("ours", ours), ("plain", plain)):
        with OpTraffic() as t:
            model.step(batches)
        out[name] = t.ops
    return out


def scaled(ops, k):
    """The counts at k times the counted shape's hidden, tokens and vocabulary (see the docstring)."""
    return {n: OpCount(c.launches, c.read * k * k, c.written * k * k, c.flops * k ** 3) for n, c in ops.items()}


def total(ops):
    t = OpCount()
    for c in ops.values():
        t.add(c)
    return t


def op_ms(c, bandwidth, flop_rate):
    return 1e3 * max(c.bytes / bandwidth, c.flops / flop_rate)


def table(ours, plain, bandwidth, flop_rate, rows=None):
    """Markdown: one row per op (ours vs plain, the largest byte differences first, either sign), totals."""
    def diff(n):
        return ours.get(n, OpCount()).bytes - plain.get(n, OpCount()).bytes
    names = sorted(set(ours) | set(plain), key=lambda n: -abs(diff(n)))
    lines = [f"| op | launches ours | plain | GB ours | GB plain | diff GB | diff ms @ {bandwidth / 1e12:.1f} TB/s "
             f"| ms ours | ms plain | GFLOP ours | GFLOP plain |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in names[:rows] if rows else names:
        a, b = ours.get(n, OpCount()), plain.get(n, OpCount())
        d = a.bytes - b.bytes
        lines.append(f"| {n} | {a.launches} | {b.launches} | {a.bytes / 1e9:.2f} | {b.bytes / 1e9:.2f} | "
                     f"{d / 1e9:+.2f} | {1e3 * d / bandwidth:+.2f} | {op_ms(a, bandwidth, flop_rate):.2f} | "
                     f"{op_ms(b, bandwidth, flop_rate):.2f} | {a.flops / 1e9:.0f} | {b.flops / 1e9:.0f} |")
    ta, tb = total(ours), total(plain)
    ma = sum(op_ms(c, bandwidth, flop_rate) for c in ours.values())
    mb = sum(op_ms(c, bandwidth, flop_rate) for c in plain.values())
    lines.append(f"| **total** | {ta.launches} | {tb.launches} | {ta.bytes / 1e9:.2f} | {tb.bytes / 1e9:.2f} | "
                 f"{(ta.bytes - tb.bytes) / 1e9:+.2f} | {1e3 * (ta.bytes - tb.bytes) / bandwidth:+.2f} | {ma:.1f} | "
                 f"{mb:.1f} | {ta.flops / 1e9:.0f} | {tb.flops / 1e9:.0f} |")
    return "\n".join(lines)


def summary(ours, plain, bandwidth):
    """Totals; 'memory_bound_*': the bytes of ops without FLOPs (all but GEMMs and attention)."""
    ta, tb = total(ours), total(plain)
    mem = [sum(c.bytes for c in ops.values() if not c.flops) for ops in (ours, plain)]
    return {"bytes_ours": ta.bytes, "bytes_plain": tb.bytes, "bytes_ratio": ta.bytes / tb.bytes,
            "memory_bound_ours": mem[0], "memory_bound_plain": mem[1],
            "launches_ours": ta.launches, "launches_plain": tb.launches,
            "diff_ms": 1e3 * (ta.bytes - tb.bytes) / bandwidth}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--arch", default="gpt-1.3b", choices=sorted(pair.PRESETS), help="the GPU shape")
    p.add_argument("--scale", type=int, default=8, help="divide hidden, sequence and vocabulary by this")
    p.add_argument("--layers", type=int, default=None, help="override the preset's layers")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--bandwidth", type=float, default=4.3, help="TB/s for memory-bound ops (H200 copy: 4.3)")
    p.add_argument("--matmul-tflops", type=float, default=790.0, help="TFLOP/s of GEMMs (H200 bf16 measured: 790)")
    p.add_argument("--rows", type=int, default=25, help="table rows (0: all)")
    p.add_argument("--check-scaling", action="store_true", help="count at 2 x --scale too and compare")
    p.add_argument("--out", default=None, help="write the table (markdown) and the counts (JSON, .json beside it)")
    p.add_argument("--fake", action="store_true",
                   help="count on fake tensors (shapes only: same counts, faster; no loss check)")
    p.add_argument("--threads", type=int, default=None)
    pair.option_flags(p)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    gpu_shape = pair.PRESETS[a.arch]
    if a.layers:
        gpu_shape = pair.dataclasses.replace(gpu_shape, layers=a.layers)
    groups = pair.init_world_of_one("cpu")
    bw, fr = a.bandwidth * 1e12, a.matmul_tflops * 1e12
    scales = [a.scale, 2 * a.scale] if a.check_scaling else [a.scale]
    results = {}
    for k in scales:
        t0 = time.perf_counter()
        shape = gpu_shape.scaled(k)
        r = count_step(groups, shape, DTYPES[a.dtype], fake=a.fake, options=pair.options(a))
        results[k] = {n: scaled(r[n], k) for n in ("ours", "plain")}
        print(f"/ {k}: hidden {shape.hidden}, seq {shape.seq}, vocab {shape.vocab}, {shape.layers} layers; first step "
              f"(loss, grad norm) ours {r['first'] and r['first'][0]} plain {r['first'] and r['first'][1]} "
              f"({time.perf_counter() - t0:.1f} s)")
        differ = r["first"] and pair.disagreement(*r["first"], DTYPES[a.dtype])
        if differ:
            sys.exit(f"ours vs plain: {differ}: the two models do not compute the same function")
    res = results[a.scale]
    head = (f"# Traffic per training step at the GPU shape ({a.arch}, counted at / {a.scale} on CPU, {a.dtype}, "
            f"bytes x {a.scale}^2)\n")
    head += (f"\n- command: `PYTHONPATH=. python bench/traffic.py {' '.join(sys.argv[1:] if argv is None else argv)}`"
             f" (torch {torch.__version__})\n- rates: {a.bandwidth} TB/s for bytes, {a.matmul_tflops} TFLOP/s for "
             "GEMMs; ms = per-op roofline max(bytes / bandwidth, FLOPs / rate)\n")
    md = head + "\n" + table(res["ours"], res["plain"], bw, fr, a.rows or None) + "\n"
    s = summary(res["ours"], res["plain"], bw)
    md += (f"\nours / plain bytes: {s['bytes_ratio']:.3f} ({s['bytes_ours'] / 1e9:.1f} GB vs "
           f"{s['bytes_plain'] / 1e9:.1f} GB); launches {s['launches_ours']} vs {s['launches_plain']}; "
           f"byte difference {s['diff_ms']:+.1f} ms at "
           f"{a.bandwidth} TB/s; without GEMMs and attention {s['memory_bound_ours'] / 1e9:.1f} GB vs "
           f"{s['memory_bound_plain'] / 1e9:.1f} GB\n")
    if a.check_scaling:
        k2 = 2 * a.scale
        for n in ("ours", "plain"):
            b1, b2 = total(results[a.scale][n]).bytes, total(results[k2][n]).bytes
            md += f"scaling check ({n}): / {a.scale} x {a.scale}^2 = {b1 / 1e9:.2f} GB, / {k2} x {k2}^2 = " \
                  f"{b2 / 1e9:.2f} GB ({100 * (b1 / b2 - 1):+.2f}%)\n"
    print(md)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(md)
        with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
            json.dump({"arch": a.arch, "scale": a.scale, "dtype": a.dtype, "summary": s,
                       "ops": {n: {op: vars(c) for op, c in res[n].items()} for n in ("ours", "plain")}}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
