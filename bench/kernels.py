"""Fused kernels vs eager torch vs torch.compile: forward + backward time per op, on a GPU.

    PYTHONPATH=. python bench/kernels.py                 # bf16, shapes of a 7B-class layer
    PYTHONPATH=. python bench/kernels.py --dtype fp16 --repeats 50

"fused" is the front with our csrc kernel (impl="csrc"); "eager" the same front's torch
path (what runs with --no-*-fusion); "compiled" that torch path under torch.compile (Inductor
fuses it too: the bar a hand-written kernel should meet). Each time is the median of
`repeats` forward + backward passes, CUDA events, after warm-up. The table, with the ratios
fused / eager and fused / compiled, goes to bench/results/kernels_<gpu>_<dtype>.md.
Needs CUDA; tests/gpu/test_kernel_speed.py runs it too.
"""
import argparse
import datetime
import os
import re
import statistics

import torch

from megatron.core.fusions import _ext, activations, norm, rope, softmax
from megatron.core.transformer.rope import rope_cos_sin

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# micro batch 1, sequence 4096, hidden 4096, 32 heads of 128, ffn 11008 (Llama-2-7B-like), TP 1
S, B, H, HEADS, D, FFN = 4096, 1, 4096, 32, 128, 11008


def _inputs(op, dtype):
    def r(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_()

    if op == "masked softmax":
        mask = torch.rand(B, 1, 1024, 1024, device="cuda") < 0.1
        return [r(B, HEADS, 1024, 1024), mask]
    if op == "causal softmax":
        return [r(B, HEADS, 2048, 2048)]
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
    "bias-gelu": (lambda x, b: activations.bias_gelu(x, b, "csrc"), activations.torch_bias_gelu),
    "bias-swiglu": (lambda x, b: activations.bias_swiglu(x, b, "csrc"), activations.torch_bias_swiglu),
    "rope": (lambda x, c, s: rope.apply_rope(x, c, s, "csrc"), rope.torch_apply_rope),
}


def _time(fn, inputs, repeats, warmup=3):
    """Median ms of fn(*inputs) forward + backward."""
    out = fn(*inputs)
    grad = torch.randn_like(out)
    times = []
    for i in range(warmup + repeats):
        for t in inputs:
            if torch.is_tensor(t) and t.grad is not None:
                t.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*inputs).backward(grad)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(dtype="bf16", repeats=20, ops=None):
    """[{op, fused_ms, eager_ms, compiled_ms}] on the current GPU."""
    if _ext.load() is None:
        raise RuntimeError(f"fused kernels unavailable: {_ext.status()}")
    rows = []
    for op in ops or OPS:
        fused, eager = OPS[op]
        inputs = _inputs(op, DTYPES[dtype])
        compiled = torch.compile(eager, dynamic=False)
        rows.append(dict(op=op, fused_ms=_time(fused, inputs, repeats), eager_ms=_time(eager, inputs, repeats),
                         compiled_ms=_time(compiled, inputs, repeats)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None, help="markdown file (default bench/results/kernels_<gpu>_<dtype>.md)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/kernels.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    rows = run(args.dtype, args.repeats)
    lines = [f"# Fused kernels vs eager vs torch.compile ({gpu}, {args.dtype})", "",
             f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda}; kernels: {_ext.status()}",
             f"- forward + backward, median of {args.repeats}; shapes: s {S}, b {B}, h {H}, heads {HEADS}, "
             f"ffn {FFN} (softmax: {HEADS} heads x 1024^2 masked, 2048^2 causal)", "",
             "| op | fused ms | eager ms | compiled ms | fused / eager | fused / compiled |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['fused_ms']:.3f} | {r['eager_ms']:.3f} | {r['compiled_ms']:.3f} | "
                     f"{r['fused_ms'] / r['eager_ms']:.2f} | {r['fused_ms'] / r['compiled_ms']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"kernels_{re.sub(r'[^A-Za-z0-9]+', '_', gpu).strip('_')}_{args.dtype}.md")
    with open(out, "w") as f:
        f.write(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
