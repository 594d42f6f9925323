"""Fused kernels vs eager torch vs torch.compile, forward + backward, against the memory roofline.

    PYTHONPATH=. python bench/kernels.py                        # bf16; table to bench/results/
    PYTHONPATH=. python bench/kernels.py --json out.json        # also the machine-readable table
    PYTHONPATH=. python bench/kernels.py --write-table          # record this GPU's figures in
                                                                # megatron/core/fusions/kernel_table.json
    PYTHONPATH=. python bench/kernels.py --write-table t.json   # ... or in another table (MEGATRON_KERNEL_TABLE)

"fused" is the front with our csrc kernel (impl="csrc"); "eager" the same front's torch path
(what runs with --no-*-fusion); "compiled" that torch path under torch.compile. Each time is
the GPU time of one forward + backward: the pass is captured in a CUDA graph and replayed back
to back (CPU launch overhead, which dominated the first measurements, is not counted), median
of `rounds` rounds of `repeats` replays. Every tensor is several times the L2 cache.

Roofline: each op's bytes that must move (op_bytes: inputs read once, outputs written once,
as a perfect fused kernel would; the partial sums and re-reads of a real one not counted) over
the device-to-device copy bandwidth measured in the same run (read + write of 1 GiB). A
kernel's "x roofline" is its time over that bound; the target is <= 1.3. --write-table records,
per op, the three times and the default the fronts run here: csrc only where it beat both eager
and compiled, else the faster of those (kernel_table.default_impl; kernel_table.choose reads it).
Needs CUDA; tests/gpu/test_kernel_speed.py runs it too.
"""
import argparse
import datetime
import json
import os
import re
import statistics

import torch

from megatron.core.fusions import _ext, activations, kernel_table, norm, rope, softmax
from megatron.core.transformer.rope import rope_cos_sin

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# micro batch 4 x sequence 4096 tokens, hidden 4096, 32 heads of 128, ffn 11008 (a Llama-2-7B
# layer, TP 1); the masked softmax [4, 32, 1024, 1024], the causal one [1, 32, 2048, 2048]
S, B, H, HEADS, D, FFN = 4096, 4, 4096, 32, 128, 11008
MASKED, CAUSAL = (4, HEADS, 1024, 1024), (1, HEADS, 2048, 2048)
SHAPES = (f"tokens {S * B} (s {S} x b {B}), hidden {H}, heads {HEADS} x {D}, ffn {FFN} (bias-gelu 4h), "
          f"masked softmax {list(MASKED)}, causal softmax {list(CAUSAL)}")


def op_bytes(op, e):
    """Bytes one forward + backward of `op` must move at the bench shapes, elements of e bytes."""
    t = S * B
    if op in ("layernorm", "rmsnorm"):
        vectors = 5 if op == "layernorm" else 3  # fwd w (b); bwd w, dw (db)
        stats = 2 if op == "layernorm" else 1    # fp32 mean / rstd per row: written, read back
        return 5 * t * H * e + vectors * H * e + 2 * stats * t * 4  # fwd x, y; bwd dy, x, dx
    if op == "bias-gelu":
        return 5 * t * 4 * H * e + 3 * 4 * H * e                     # fwd x, y; bwd dy, x, dx; b, b, db
    if op == "bias-swiglu":
        return 8 * t * FFN * e + 3 * 2 * FFN * e                     # x 2f, y f; dy f, x 2f, dx 2f
    if op == "rope":
        n = S * B * HEADS * D
        return 4 * n * e + 4 * S * D * e                             # x, y; dy, dx; cos, sin twice
    if op == "masked softmax":
        n = MASKED[0] * MASKED[1] * MASKED[2] * MASKED[3]
        return 5 * n * e + MASKED[0] * MASKED[2] * MASKED[3]          # x, y; dy, y, dx; the bool mask once
    if op == "causal softmax":
        b, h, sq, sk = CAUSAL
        n, lower = b * h * sq * sk, b * h * sq * (sq + 1) // 2         # reads stop at the diagonal
        return (lower + n) * e + (2 * lower + n) * e                  # fwd x, y; bwd dy, y, dx
    raise KeyError(op)


def _inputs(op, dtype):
    def r(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_()

    if op == "masked softmax":
        mask = torch.rand(MASKED[0], 1, MASKED[2], MASKED[3], device="cuda") < 0.1
        return [r(*MASKED), mask]
    if op == "causal softmax":
        return [r(*CAUSAL)]
    if op in ("layernorm", "rmsnorm"):
        return [r(S * B, H), r(H), r(H)] if op == "layernorm" else [r(S * B, H), r(H)]
    if op == "bias-gelu":
        return [r(S * B, 4 * H), r(4 * H)]
    if op == "bias-swiglu":
        return [r(S * B, 2 * FFN), r(2 * FFN)]
    if op == "rope":
        cos, sin = rope_cos_sin(S, D, 10000, "cuda", dtype)
        return [r(S, B, HEADS, D), cos, sin]
    raise KeyError(op)


# op -> (fused front call, torch path)
OPS = {
    "masked softmax": (lambda x, m: softmax.scaled_masked_softmax(x, m, 0.125, "csrc"),
                       lambda x, m: softmax.torch_scaled_masked_softmax(x, m, 0.125)),
    "causal softmax": (lambda x: softmax.scaled_upper_triang_masked_softmax(x, 0.125, "csrc"),
                       lambda x: softmax.torch_scaled_masked_softmax(x, None, 0.125, causal=True)),
    "layernorm": (lambda x, w, b: norm.layer_norm(x, w, b, 1e-5, "csrc"),
                  lambda x, w, b: norm.layer_norm(x, w, b, 1e-5, "torch")),
    "rmsnorm": (lambda x, w: norm.rms_norm(x, w, 1e-5, "csrc"), lambda x, w: norm.torch_rms_norm(x, w, 1e-5)),
    # "compiled" in the fronts is torch.compile of these same torch functions
    "bias-gelu": (lambda x, b: activations.bias_gelu(x, b, "csrc"), activations.torch_bias_gelu),
    "bias-swiglu": (lambda x, b: activations.bias_swiglu(x, b, "csrc"), activations.torch_bias_swiglu),
    "rope": (lambda x, c, s: rope.apply_rope(x, c, s, "csrc"), rope.torch_apply_rope),
}


def _clear_grads(inputs):
    for t in inputs:
        if torch.is_tensor(t):
            t.grad = None


def _replay_ms(run, repeats, rounds):
    """Median over rounds of the mean ms per call of `run` (a graph replay), calls back to back."""
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / repeats)
    return statistics.median(times)


def _time(fn, inputs, repeats, rounds=5, warmup=3):
    """GPU ms of one fn(*inputs).backward(grad), from a CUDA graph of it replayed back to back."""
    grad = torch.randn_like(fn(*inputs))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # graph capture wants its warm-up off the default stream
        for _ in range(warmup):
            _clear_grads(inputs)
            fn(*inputs).backward(grad)
    torch.cuda.current_stream().wait_stream(side)
    _clear_grads(inputs)  # the captured backward then writes fresh grads instead of accumulating
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn(*inputs).backward(grad)
    except RuntimeError as e:  # not capturable: eager launches back to back (CPU overhead may show)
        print(f"warning: bench/kernels.py: no CUDA graph ({str(e).splitlines()[0][:120]}); timing eager launches")
        torch.cuda.synchronize()

        def run():
            _clear_grads(inputs)
            fn(*inputs).backward(grad)
        return _replay_ms(run, repeats, rounds)
    ms = _replay_ms(graph.replay, repeats, rounds)
    del graph
    _clear_grads(inputs)
    return ms


def copy_bandwidth(gib=1, repeats=20):
    """Device-to-device copy bandwidth in bytes/s (read + write of a `gib` GiB buffer)."""
    src = torch.empty(gib << 30, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dst.copy_(src)
    ms = _replay_ms(graph.replay, repeats, 5)
    return 2 * src.numel() / (ms * 1e-3)


def run(dtype="bf16", repeats=20, ops=None):
    """[{op, bytes, fused_ms, eager_ms, compiled_ms, ...}] on the current GPU, with the copy
    bandwidth of the same run in each row (copy_tb_s) and each time against the roofline."""
    if _ext.load() is None:
        raise RuntimeError(f"fused kernels unavailable: {_ext.status()}")
    bandwidth = copy_bandwidth()
    e = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    rows = []
    for op in ops or OPS:
        fused, eager = OPS[op]
        inputs = _inputs(op, DTYPES[dtype])
        compiled = torch.compile(eager, dynamic=False)
        row = dict(op=op, bytes=op_bytes(op, e), copy_tb_s=bandwidth / 1e12)
        row["roofline_ms"] = row["bytes"] / bandwidth * 1e3
        for impl, fn in (("fused", fused), ("eager", eager), ("compiled", compiled)):
            ms = _time(fn, inputs, repeats)
            row[f"{impl}_ms"] = ms
            row[f"{impl}_tb_s"] = row["bytes"] / (ms * 1e-3) / 1e12
            row[f"{impl}_x_roofline"] = ms / row["roofline_ms"]
        row["default"] = kernel_table.default_impl(row["fused_ms"], row["eager_ms"], row["compiled_ms"])
        rows.append(row)
        del inputs
        torch.cuda.empty_cache()
    return rows


def markdown(rows, gpu, dtype, repeats):
    bw = rows[0]["copy_tb_s"] if rows else float("nan")
    lines = [f"# Fused kernels vs eager vs torch.compile ({gpu}, {dtype})", "",
             f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda}; kernels: {_ext.status()}",
             f"- forward + backward, GPU time from CUDA graph replays (median of 5 rounds of {repeats}); {SHAPES}",
             f"- device-to-device copy in the same run: {bw:.2f} TB/s; roofline = bytes that must move / that",
             "",
             "| op | MB moved | roofline ms | fused ms | fused TB/s | fused x roofline | eager ms | eager TB/s "
             "| compiled ms | compiled TB/s | fused / eager | fused / compiled | default |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['bytes'] / 1e6:.0f} | {r['roofline_ms']:.3f} | {r['fused_ms']:.3f} | "
                     f"{r['fused_tb_s']:.2f} | {r['fused_x_roofline']:.2f} | {r['eager_ms']:.3f} | "
                     f"{r['eager_tb_s']:.2f} | {r['compiled_ms']:.3f} | {r['compiled_tb_s']:.2f} | "
                     f"{r['fused_ms'] / r['eager_ms']:.2f} | {r['fused_ms'] / r['compiled_ms']:.2f} | {r['default']} |")
    return "\n".join(lines) + "\n"


def write_table(rows, gpu, dtype, path):
    """Record this GPU's figures in the kernel table at `path` (other GPUs' entries kept)."""
    table = {}
    if os.path.exists(path):
        with open(path) as f:
            table = json.load(f)
    entry = {"_meta": {"source": f"bench/kernels.py on {datetime.date.today().isoformat()}; fwd + bwd GPU ms",
                       "torch": torch.__version__, "dtype": dtype, "shapes": SHAPES,
                       "kernels": _ext.source_hash(_ext.CSRC) or "unknown"}}
    for r in rows:
        entry[r["op"]] = {k: round(r[k], 4) for k in kernel_table.FIELDS} | {"default": r["default"]}
    table[gpu] = entry
    with open(path, "w") as f:
        json.dump(table, f, indent=2)
        f.write("\n")
    kernel_table.load.cache_clear()
    kernel_table.load(path)  # what was written must read back


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--ops", nargs="+", choices=list(OPS), default=None)
    parser.add_argument("--out", default=None, help="markdown file (default bench/results/kernels_<gpu>_<dtype>.md)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--write-table", nargs="?", const=kernel_table.DEFAULT_PATH, default=None, metavar="PATH",
                        help=f"record this GPU's figures in a kernel table (default {kernel_table.DEFAULT_PATH})")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: bench/kernels.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    rows = run(args.dtype, args.repeats, args.ops)
    text = markdown(rows, gpu, args.dtype, args.repeats)
    print(text)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"kernels_{re.sub(r'[^A-Za-z0-9]+', '_', gpu).strip('_')}_{args.dtype}.md")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print(f"written to {out}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=gpu, dtype=args.dtype, torch=torch.__version__, cuda=torch.version.cuda,
                           date=datetime.datetime.now().isoformat(timespec="seconds"), shapes=SHAPES, rows=rows),
                      f, indent=2)
        print(f"JSON written to {args.json}")
    if args.write_table:
        write_table(rows, gpu, args.dtype, args.write_table)
        print(f"kernel table for {gpu} written to {args.write_table}")


if __name__ == "__main__":
    main()
