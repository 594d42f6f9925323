"""The vocabulary-parallel cross entropy's implementations, forward + backward, against the memory roofline.

    PYTHONPATH=. python bench/cross_entropy.py                 # CUDA: the GPT 1.3B step's shape, bf16
    PYTHONPATH=. python bench/cross_entropy.py --device cpu --tokens 512 --vocab 4000

Rows: "vocab-parallel" (cross_entropy.py, what runs without --cross-entropy-loss-fusion), "fused, chunked"
(cross_entropy_fused.py's eager path: CPU, or CUDA without triton) and "fused, compiled" (its torch.compile
path, what --cross-entropy-loss-fusion runs on a GPU with triton). Each row's loss and logits gradient are
checked against the first row's before it is timed (a wrong implementation is reported, not timed). Roofline:
the bytes a one-pass kernel must move, the bf16 logits read forward, read again and the gradient written
backward (6 bytes per logit), over the device-to-device copy bandwidth of the same run (CUDA only). CUDA times:
CUDA events around back-to-back passes (bench/kernels.py's _replay_ms, median of 5 rounds), each pass on one
leaf of the logits (the fused eager path writes its gradient over them: harmless to a timing); CPU times are
wall clock (a correctness run).
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron.core.comm import PlanGroup  # noqa: E402
from megatron.core.tensor_parallel import cross_entropy_fused  # noqa: E402
from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy  # noqa: E402

TOKENS, VOCAB = 8192, 50304  # micro batch 4 x sequence 2048 at the GPT 1.3B shape of the GPU suite


@contextlib.contextmanager
def _path(compiled):
    """cross_entropy_fused's path forced to the compiled (True) or eager (False) one for the rows."""
    saved = cross_entropy_fused.use_compiled
    cross_entropy_fused.use_compiled = lambda x: compiled
    try:
        yield
    finally:
        cross_entropy_fused.use_compiled = saved


def implementations(device):
    """(name, fn(logits, target), compiled path or None) for the rows that can run on `device`."""
    unfused = lambda x, t: vocab_parallel_cross_entropy(x, t, None, PlanGroup(1))  # noqa: E731
    fused = lambda x, t: cross_entropy_fused.fused_vocab_parallel_cross_entropy(x, t, None, PlanGroup(1))  # noqa: E731
    rows = [("vocab-parallel", unfused, None), ("fused, chunked", fused, False)]
    if torch.device(device).type == "cpu" or cross_entropy_fused.importable("triton"):
        rows.append(("fused, compiled", fused, True))  # on CPU: inductor's C++ backend (a correctness run)
    return rows


def _pass(fn, logits, target, grad):
    """One forward + backward from a fresh copy of the logits (the fused path writes its gradient over them)."""
    x = logits.clone().requires_grad_()
    loss = fn(x * 1, target)  # the logits come out of a layer, as in the model
    loss.backward(grad)
    return loss.detach(), x.grad


def _timed(fn, leaf, target, grad):
    leaf.grad = None
    fn(leaf, target).backward(grad)


def _wall_ms(run, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(device="cuda", tokens=TOKENS, vocab=VOCAB, dtype=torch.bfloat16, repeats=20):
    """[{name, ms, bytes, max_loss_diff, max_grad_diff, ...}] at [tokens, vocab] logits of `dtype`."""
    g = torch.Generator(device=device).manual_seed(5)
    logits = (torch.randn(tokens, 1, vocab, generator=g, device=device) * 2).to(dtype)
    target = torch.randint(0, vocab, (tokens, 1), generator=g, device=device)
    grad = torch.full((tokens, 1), 1.0 / tokens, device=device)
    must_move = 6 * tokens * vocab  # bf16: 2 bytes read forward, 2 read + 2 written backward
    cuda = torch.device(device).type == "cuda"
    bandwidth = None
    if cuda:
        from kernels import _replay_ms, copy_bandwidth  # bench/kernels.py's timing
        bandwidth = copy_bandwidth()
    rows, ref = [], None
    for name, fn, compiled in implementations(device):
        with _path(compiled) if compiled is not None else contextlib.nullcontext():
            loss, dx = _pass(fn, logits, target, grad)
            if ref is None:
                ref = (loss.float(), dx.float())
            row = dict(name=name, bytes=must_move, max_loss_diff=(loss.float() - ref[0]).abs().max().item(),
                       max_grad_diff=(dx.float() - ref[1]).abs().max().item())
            leaf = logits.clone().requires_grad_()
            for _ in range(3):  # warm-up (the compiled path compiles here)
                _timed(fn, leaf, target, grad)
            if cuda:
                torch.cuda.synchronize()
                row["ms"] = _replay_ms(lambda fn=fn, leaf=leaf: _timed(fn, leaf, target, grad), repeats, 5)
                row["tb_s"] = must_move / (row["ms"] * 1e-3) / 1e12
                row["x_roofline"] = row["ms"] / (must_move / bandwidth * 1e3)
            else:
                row["ms"] = _wall_ms(lambda fn=fn, leaf=leaf: _timed(fn, leaf, target, grad), repeats)
            rows.append(row)
    return rows, bandwidth


def markdown(rows, device, tokens, vocab, bandwidth):
    head = [f"# Cross entropy, forward + backward ({device}; logits [{tokens}, {vocab}] bf16)", ""]
    if bandwidth:
        head += [f"- device-to-device copy in the same run: {bandwidth / 1e12:.2f} TB/s; roofline: 6 bytes per "
                 "logit (read forward, read and write the gradient backward)", ""]
    lines = head + ["| implementation | ms | TB/s | x roofline | max loss diff | max grad diff |",
                    "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['ms']:.3f} | {r.get('tb_s', float('nan')):.2f} | "
                     f"{r.get('x_roofline', float('nan')):.2f} | {r['max_loss_diff']:.2e} | {r['max_grad_diff']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tokens", type=int, default=TOKENS)
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; use --device cpu for a correctness run")
    rows, bandwidth = run(a.device, a.tokens, a.vocab, repeats=a.repeats)
    print(markdown(rows, torch.cuda.get_device_name() if a.device == "cuda" else "cpu", a.tokens, a.vocab, bandwidth))
    return 0


if __name__ == "__main__":
    sys.exit(main())
