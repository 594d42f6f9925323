"""Framework overhead: time per training step of ours vs. a plain PyTorch model (eager and compiled).

    PYTHONPATH=. python bench/overhead.py                                   # CPU, fp32, small GPT
    PYTHONPATH=. python bench/overhead.py --arch llama --layers 2 --hidden 64 --heads 4 --query-groups 2 \
        --seq 32 --vocab 256 --micro-batch 2 --num-micro 2 --compile       # tiny Llama on CPU
    PYTHONPATH=. python bench/overhead.py --device cuda --dtype bf16 --preset gpt-1.3b --compile \
        --out bench/results/overhead_gpt.md                                 # issue 27's GPU shapes

Ours and the plain models are bench/pair.py's: the plain model (bench/plain_models.py: nanoGPT-style
GPT, gpt-fast-style Llama; bench/plain_moe_model.py: a loop-over-experts MoE) starts from our
weights, so the first step's token loss and grad norm must agree (checked: both compute the same
function, hence the same FLOPs); "plain (compiled)" is the same model under torch.compile. The timed
steps are interleaved (A B C A B C ..., order reversed every round) so machine noise hits all alike.
Reported per model: median ms/step, tokens/s, model TFLOP/s (megatron/training/observability/flops.py, the figure
our log uses) and MFU (on a GPU in the peak table), and on CUDA the peak memory one step needs alone
(what it holds between steps plus the most its step allocates on top). The table goes to --out as
markdown and JSON.
"""
import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

from bench import pair
from megatron.training.observability.flops import peak_tflops_per_gpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODELS = ("ours", "plain", "compiled")
LABELS = {"ours": "ours", "plain": "plain", "compiled": "plain (compiled)"}


def timed(device, fn):
    """(ms, fn()) with the device's work included."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end), out
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def peak_bytes(device, obj, step):
    """The memory one step of obj needs alone: its held tensors + the most its step allocates on
    top (CUDA allocator figures, the other models' memory excluded); None off CUDA."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    held, base = pair.held_bytes(obj.held_tensors()), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return held + torch.cuda.max_memory_allocated() - base


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default=None, choices=sorted(pair.PRESETS),
                   help="a shape of issue 27's GPU measurements (the shape flags below override it)")
    p.add_argument("--arch", default=None, choices=pair.ARCHS, help="default gpt (or the preset's)")
    p.add_argument("--query-groups", "--kv-heads", type=int, default=None, help="key/value head groups (llama)")
    for flag, kind, what in [("--layers", int, "layers"), ("--hidden", int, "hidden size"),
                             ("--heads", int, "attention heads"),
                             ("--ffn", int, "MLP (expert) hidden size (default 4 x hidden)"),
                             ("--seq", int, "sequence length"), ("--vocab", int, "vocabulary (no padding: ours pads "
                                                                                   "to a multiple it divides)"),
                             ("--micro-batch", int, "micro batch"), ("--num-micro", int, "microbatches per step"),
                             ("--experts", int, "experts (moe)"), ("--topk", int, "experts per token (moe)")]:
        p.add_argument(flag, type=kind, default=None, help=what)
    p.add_argument("--models", default="ours,plain", help="comma-separated, of " + ", ".join(MODELS))
    p.add_argument("--compile", action="store_true", help="add the plain model under torch.compile")
    p.add_argument("--torch-ops", action="store_true", help="ours with every fused-kernel front on plain torch")
    pair.option_flags(p)
    p.add_argument("--rounds", type=int, default=6, help="timed rounds")
    p.add_argument("--steps-per-round", type=int, default=3, help="steps of each model per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each model first (compile happens here)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--plain-optim", "--baseline-optim", default="fused", choices=["foreach", "fused", "default"],
                   help="torch.optim.AdamW implementation of the plain models")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--profile", action="store_true", help="after timing, a torch.profiler table per model")
    p.add_argument("--no-write", action="store_true", help="write no results file")
    p.add_argument("--out", default=None, help="markdown results file (JSON beside it, .json); default "
                   "bench/results/overhead_<device>[_<dtype>][_<arch>].md")
    a = p.parse_args(argv)
    base = pair.PRESETS[a.preset] if a.preset else pair.Shape(arch=a.arch or "gpt")
    given = {f: getattr(a, f) for f in ("arch", "layers", "hidden", "heads", "ffn", "seq", "vocab", "micro_batch",
                                        "num_micro", "experts", "topk") if getattr(a, f) is not None}
    if a.query_groups is not None:
        given["groups"] = a.query_groups
    if "hidden" in given and "ffn" not in given:
        given["ffn"] = 4 * given["hidden"]
    a.shape = dataclasses.replace(base, **given)
    a.option_flags = [f for f, on in (("--cross-entropy-loss-fusion", a.cross_entropy_loss_fusion),
                                      ("--no-gradient-accumulation-fusion", a.no_gradient_accumulation_fusion)) if on]
    a.models = [m.strip() for m in a.models.split(",") if m.strip()] + (["compiled"] if a.compile else [])
    for m in a.models:
        if m not in MODELS:
            p.error(f"--models: {m!r} is not one of {', '.join(MODELS)}")
    s = a.shape
    if s.hidden % s.heads or s.heads % s.groups:
        p.error(f"--hidden ({s.hidden}) must be a multiple of --heads ({s.heads}), and --heads of --query-groups")
    return a


def build(a, device, dtype, groups):
    hp = pair.Hyper(seed=a.seed, decay_iters=10 * (a.warmup + a.rounds * a.steps_per_round + 10))
    ours = pair.Ours(a.shape, groups, device, dtype, hp, torch_ops=a.torch_ops, options=pair.options(a))
    built = {"ours": ours}
    for m in a.models:
        if m != "ours":
            built[m] = pair.Plain(a.shape, ours, device, dtype, hp, a.plain_optim, compile=m == "compiled")
    if "ours" not in a.models:
        del built["ours"]
    counts = {m: sum(p.numel() for p in o.model.parameters()) for m, o in built.items()}
    if len(set(counts.values())) > 1:
        sys.exit(f"parameter counts differ ({counts}): the models do not do the same FLOPs")
    return built, ours, counts


def main(argv=None):
    a = parse(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device, dtype = torch.device(a.device), DTYPES[a.dtype]
    if device.type == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    groups = pair.init_world_of_one(device)
    models, ours, params = build(a, device, dtype, groups)
    batches = pair.make_batches(a.shape, a.seed, device)
    names = list(models)
    print(f"parameters: {params}; {a.shape}")

    first = {}
    print(f"warm-up: {a.warmup} steps each (untimed)")
    for k in range(a.warmup):
        line = []
        for n in names:
            loss, norm = models[n].step(batches)
            first.setdefault(n, (float(loss), float(norm)))
            line.append(f"{n} loss {float(loss):.5f} grad norm {float(norm):.5f}")
        print(f"  step {k + 1}: " + " | ".join(line))
    for n in names[1:]:
        differ = pair.disagreement(first[n], first[names[0]], dtype)
        if differ:
            sys.exit(f"{n} vs {names[0]}: {differ}: the models do not compute the same function")

    times = {n: [] for n in names}
    t_start = time.perf_counter()
    for r in range(a.rounds):
        for _ in range(a.steps_per_round):
            for n in names if r % 2 == 0 else names[::-1]:
                times[n].append(timed(device, lambda n=n: models[n].step(batches))[0])
        print(f"round {r + 1}/{a.rounds}: median ms " + ", ".join(
            f"{n} {statistics.median(v):.1f}" for n, v in times.items()))
    wall = time.perf_counter() - t_start
    peaks = {n: peak_bytes(device, models[n], lambda n=n: models[n].step(batches)) for n in names}

    flops = pair.step_flops(ours, a.shape)
    peak = peak_tflops_per_gpu(device, dtype)
    rows = {}
    labels = {**LABELS, "ours": f"ours ({' '.join(a.option_flags)})" if a.option_flags else "ours"}
    for n in names:
        med = statistics.median(times[n])
        tflops = flops / med / 1e9
        rows[n] = {"model": labels[n], "params": params[n], "median_ms": med, "min_ms": min(times[n]),
                   "max_ms": max(times[n]), "tokens_per_s": a.shape.tokens_per_step / med * 1e3,
                   "model_tflops": tflops, "mfu": tflops / peak[1] if peak else None, "peak_memory_bytes": peaks[n],
                   "first_loss": first[n][0], "first_grad_norm": first[n][1]}
    ratios = {n: rows["ours"]["median_ms"] / rows[n]["median_ms"] for n in names if n != "ours" and "ours" in rows}
    table = "\n".join(
        ["| model | params | median ms/step | min | max | tokens/s | model TFLOP/s | MFU | peak memory GiB |"
         " first loss |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        + [f"| {r['model']} | {r['params']:,} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {r['max_ms']:.1f} | "
           f"{r['tokens_per_s']:,.0f} | {r['model_tflops']:.2f} | "
           f"{'%.1f%%' % (100 * r['mfu']) if r['mfu'] is not None else 'n/a'} | "
           f"{'%.2f' % (r['peak_memory_bytes'] / 2**30) if r['peak_memory_bytes'] is not None else 'n/a'} | "
           f"{r['first_loss']:.5f} |" for r in rows.values()])
    summary = "ratio (median ms/step) " + "; ".join(f"ours / {labels[n]}: {v:.3f}" for n, v in ratios.items())
    print("\n" + table + "\n" + summary)
    dev_name = torch.cuda.get_device_name(0) if device.type == "cuda" else \
        f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    for r in rows.values():  # one line per model for bench/gpu_suite.py's report
        print("RESULT " + json.dumps({
            "name": f"{a.shape.arch} {r['model']} (bench/overhead.py)", "device": dev_name,
            "ms_per_step": round(r["median_ms"], 1), "tflops": round(r["model_tflops"], 1), "mfu": r["mfu"],
            "peak_mem_gib": r["peak_memory_bytes"] / 2**30 if r["peak_memory_bytes"] is not None else None}))

    cmd = "PYTHONPATH=. python bench/overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
            "device": dev_name, "dtype": a.dtype, "command": cmd, "shape": dataclasses.asdict(a.shape),
            "tokens_per_step": a.shape.tokens_per_step, "model_flops_per_step": flops,
            "mfu_peak": peak[0] if peak else None, "timing": f"{a.warmup} warm-up steps each, then {a.rounds} "
            f"rounds x {a.steps_per_round} steps interleaved; {wall:.0f} s timed"}
    md = "\n".join([f"# Framework overhead: ours vs. plain PyTorch, {a.shape.arch} ({a.device}, {a.dtype})", ""]
                   + [f"- {k}: {v}" for k, v in meta.items()]
                   + ["- ours: GPTModel + DistributedDataParallel + MegatronOptimizer (fp32 main weights, fused "
                      "AdamW) + train_step" + (" (fused-kernel fronts on torch)" if a.torch_ops else ""),
                      f"- plain: bench/plain_models.py / plain_moe_model.py, torch.optim.AdamW ({a.plain_optim}) on "
                      "its own parameters, clip_grad_norm_(foreach); same initial weights, first step agrees",
                      "", table, "", f"**{summary}**", ""])
    if not a.no_write:
        out = a.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                    f"overhead_{a.device}" + ("" if a.dtype == "fp32" else f"_{a.dtype}")
                                    + ("" if a.shape.arch == "gpt" else f"_{a.shape.arch}") + ".md")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(md)
        with open(os.path.splitext(out)[0] + ".json", "w") as f:
            json.dump({**meta, "rows": rows, "ratios": ratios}, f, indent=1)
        print(f"wrote {out} (and .json)")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        for n in names:
            with profile(activities=acts) as prof:
                for _ in range(2):
                    timed(device, lambda n=n: models[n].step(batches))
            print(f"\n==== profile: {n} (2 steps), sorted by {sort}")
            print(prof.key_averages().table(sort_by=sort, row_limit=30))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
