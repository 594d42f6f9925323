"""Where does our per-step time differ from plain PyTorch? Component micro-benchmarks.

    PYTHONPATH=. python bench/overhead_parts.py [--threads 1] [same shape flags as overhead.py]

Each line times one piece of our train_step against its plain-PyTorch counterpart,
interleaved (A B A B ...), median ms over --reps:

  fwd+bwd      GPTModel forward+backward (+ our loss masking) vs the baseline model's
  loss         vocab_parallel_cross_entropy + mask-sum / tokens vs F.cross_entropy (fwd+bwd)
  row-linear   RowParallelLinear (F.linear, then + bias, through _Reduce) vs nn.Linear
  col-linear   ColumnParallelLinear (through _Copy) vs nn.Linear
  grad-norm    get_grad_norm + clip_grads_ vs clip_grad_norm_(foreach=True)
  adamw        build_optimizer's AdamW vs AdamW(foreach=True) and AdamW(fused=True)
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import overhead as ob  # noqa: E402

from megatron.core.config import TransformerConfig  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.optimizer import build_optimizer, clip_grads_, get_grad_norm  # noqa: E402
from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy  # noqa: E402
from megatron.core.tensor_parallel.initialization import initialize_parameters  # noqa: E402
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_seed  # noqa: E402


def bench(fns, reps, warmup=2):
    """fns: {name: callable}; interleaved; returns {name: median ms}."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    t = {k: [] for k in fns}
    for r in range(reps):
        items = list(fns.items()) if r % 2 == 0 else list(fns.items())[::-1]
        for k, f in items:
            t0 = time.perf_counter()
            f()
            t[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in t.items()}, {k: min(v) for k, v in t.items()}


def show(title, res):
    med, mn = res
    names = list(med)
    ref = med[names[-1]]
    cells = "   ".join(f"{k}: {med[k]:8.2f} ms (min {mn[k]:7.2f})" for k in names)
    print(f"{title:<11} {cells}   ours-first/last: {med[names[0]] / ref:.3f}  delta {med[names[0]] - ref:+.2f} ms")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    ffn = 4 * a.hidden
    dev = torch.device("cpu")
    groups = ob.init_world_of_one(dev, "gloo")
    model_parallel_seed(1234, 0, 0, dev)
    s, b, h, V = a.seq, a.micro_batch, a.hidden, a.vocab
    tok = s * b
    print(f"threads {torch.get_num_threads()}, shapes L{a.layers} h{h} heads{a.heads} s{s} b{b} V{V}")

    # -- whole model fwd+bwd (no optimizer, no clipping)
    cfg = TransformerConfig(num_layers=a.layers, hidden_size=h, num_attention_heads=a.heads, ffn_hidden_size=ffn,
                            seq_length=s, hidden_dropout=0.0, attention_dropout=0.0)
    cfg.vocab_size = V
    ours = GPTModel(cfg, groups, device=dev)
    initialize_parameters(ours, 1234, 0, 1)
    base = ob.BaselineGPT(V, s, h, a.heads, ffn, a.layers)
    ob.copy_ours_into_baseline(ours, base)
    ids = torch.randint(0, V, (b, s + 1))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    mask = torch.ones(b, s)
    n = mask.sum()

    def ours_fb():
        ours.zero_grad(set_to_none=True)
        loss = ours(x, labels=y)
        ((loss.float() * mask).sum() / n).backward()

    def base_fb():
        base.zero_grad(set_to_none=True)
        base(x, y).backward()
    show("fwd+bwd", bench({"ours": ours_fb, "baseline": base_fb}, a.reps))

    # -- loss alone: logits [s, b, V] (ours' layout) vs [b, s, V]
    lg = torch.randn(s, b, V, requires_grad=True)
    lg2 = torch.randn(b, s, V, requires_grad=True)

    def ours_loss():
        lg.grad = None
        l = vocab_parallel_cross_entropy(lg, y.t(), V, groups.tp).t()
        ((l.float() * mask).sum() / n).backward()

    def base_loss():
        lg2.grad = None
        F.cross_entropy(lg2.float().view(-1, V), y.view(-1)).backward()
    show("loss", bench({"ours": ours_loss, "baseline": base_loss}, a.reps))

    # -- linears, [s, b, in] activations
    def lin_pair(ours_lin, fin, fout):
        ref = nn.Linear(fin, fout)
        inp = torch.randn(s, b, fin, requires_grad=True)

        def o():
            inp.grad = None
            ours_lin.zero_grad(set_to_none=True)
            ours_lin(inp)[0].sum().backward()

        def r():
            inp.grad = None
            ref.zero_grad(set_to_none=True)
            ref(inp).sum().backward()
        return {"ours": o, "nn.Linear": r}
    show("row-linear", bench(lin_pair(RowParallelLinear(ffn, h, group=groups.tp), ffn, h), a.reps))
    show("col-linear", bench(lin_pair(ColumnParallelLinear(h, ffn, group=groups.tp), h, ffn), a.reps))

    # -- grad norm + clip, with real grads
    ours_fb()
    base_fb()
    params_o = list(ours.parameters())

    def ours_clip():
        clip_grads_(params_o, 1.0, get_grad_norm(params_o, groups))

    def base_clip():
        torch.nn.utils.clip_grad_norm_(base.parameters(), 1.0, foreach=True)
    show("grad-norm", bench({"ours": ours_clip, "baseline": base_clip}, a.reps * 3))

    # -- optimizer step
    opts = {"ours(build_optimizer)": build_optimizer(ours, 1e-4, 0.1, (0.9, 0.95), 1e-8)}
    for impl in ("foreach", "fused"):
        m = ob.BaselineGPT(V, s, h, a.heads, ffn, a.layers)
        for q, r in zip(m.parameters(), base.parameters()):
            q.grad = r.grad.clone()
        opts[f"AdamW({impl})"] = ob.baseline_optimizer(m, 1e-4, 0.1, (0.9, 0.95), 1e-8, impl)
    o = opts["ours(build_optimizer)"]
    print(f"            build_optimizer on CPU: foreach={o.defaults['foreach']} fused={o.defaults['fused']}"
          " (None/None = single-tensor for-loop)")
    show("adamw", bench({k: v.step for k, v in opts.items()}, a.reps * 2))


if __name__ == "__main__":
    main()
