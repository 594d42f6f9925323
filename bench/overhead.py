"""Framework overhead: time per training step of our GPT vs. a plain single-file PyTorch GPT.

    PYTHONPATH=. python bench/overhead.py                      # CPU, fp32, small default shapes
    PYTHONPATH=. python bench/overhead.py --device cuda --dtype bf16 --layers 12 --hidden 768 \
        --heads 12 --seq 1024 --vocab 50304 --micro-batch 8

"Ours" is the real thing on a world of one: GPTModel built from TransformerConfig over a
gloo (or nccl) process group via initialize_model_parallel(1, 1), initialize_parameters,
DistributedDataParallel + MegatronOptimizer, LRScheduler, and `train_step` from megatron/training/training.py with a
forward_step like pretrain_gpt.py's.

"Baseline" is a straightforward nanoGPT-style model written below: token + learned position
embedding, pre-LN blocks with one fused qkv Linear, F.scaled_dot_product_attention (causal),
GeLU MLP, final LN, tied output layer, F.cross_entropy, trained with torch.optim.AdamW
(foreach, same betas / eps / weight-decay groups) and global-norm clipping.

Both have the same shapes and parameter count (checked), dropout 0, and start from the
same weights (ours are copied into the baseline) so the first steps' losses must agree:
that checks both compute the same function, hence the same FLOPs. The timed steps are
interleaved A B A B ... (order flipped every round) so machine noise hits both alike; the
table reports median ms/step and ours / baseline (target <= 1.05), and is written to
bench/results/overhead_<device>[_<dtype>].md.
"""
import argparse
import datetime
import os
import platform
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from megatron.core.config import TransformerConfig
from megatron.core.distributed import DistributedDataParallel
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import LRScheduler, MegatronOptimizer
from megatron.core.parallel_state import initialize_model_parallel
from megatron.core.pipeline_parallel import loss_means
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.training import train_step

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# --------------------------------------------------------------------------- baseline
class Block(nn.Module):
    def __init__(self, h, heads, ffn, eps):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(h, eps=eps)
        self.c_attn = nn.Linear(h, 3 * h)          # one fused qkv projection
        self.c_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h, eps=eps)
        self.c_fc = nn.Linear(h, ffn)
        self.mlp_proj = nn.Linear(ffn, h)

    def forward(self, x):
        B, T, C = x.shape
        # qkv rows laid out per head as [q, k, v] (Megatron's order) so our weights copy over
        qkv = self.c_attn(self.ln_1(x)).view(B, T, self.heads, 3, C // self.heads)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))    # [B, nh, T, hd]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class BaselineGPT(nn.Module):
    def __init__(self, vocab, seq, h, heads, ffn, layers, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads, ffn, eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h, eps=eps)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)        # tied output layer
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def copy_ours_into_baseline(ours, base):
    """Same starting point: every baseline parameter takes the value of ours."""
    m = {"wte.weight": "word_embeddings.weight", "wpe.weight": "position_embeddings",
         "ln_f.weight": "decoder.final_layernorm.weight", "ln_f.bias": "decoder.final_layernorm.bias"}
    per_layer = {"ln_1": "input_layernorm", "c_attn": "self_attention.linear_qkv",
                 "c_proj": "self_attention.linear_proj", "ln_2": "pre_mlp_layernorm",
                 "c_fc": "mlp.linear_fc1", "mlp_proj": "mlp.linear_fc2"}
    for i in range(len(base.blocks)):
        for b, o in per_layer.items():
            for w in ("weight", "bias"):
                m[f"blocks.{i}.{b}.{w}"] = f"decoder.layers.{i}.{o}.{w}"
    src = dict(ours.named_parameters())
    dst = dict(base.named_parameters())
    assert set(m) == set(dst), sorted(set(dst) ^ set(m))
    with torch.no_grad():
        for b, o in m.items():
            assert dst[b].shape == src[o].shape, (b, dst[b].shape, o, src[o].shape)
            dst[b].copy_(src[o])


def baseline_optimizer(model, lr, wd, betas, eps, impl):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    kw = {"foreach": impl == "foreach", "fused": True if impl == "fused" else None}
    if impl == "default":
        kw = {}
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, **kw)


def baseline_step(model, opt, sched, batches, iteration, clip):
    """nanoGPT's loop: zero_grad, grad accumulation, clip by global norm, lr, step."""
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for b in batches:
        loss = model(b["tokens"], b["labels"]) / len(batches)
        loss.backward()
        total = total + loss.detach()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
    lr = sched.get_lr(iteration)              # the same schedule arithmetic; cost is nil
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return total, norm, lr


# --------------------------------------------------------------------------- ours
def forward_step(model, batch):
    """As pretrain_gpt.py (one stage): -> {"lm loss": (per-token loss [b, s], loss mask [b, s])}."""
    return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}


def init_world_of_one(device, backend):
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=5))
    return initialize_model_parallel(1, 1)


# --------------------------------------------------------------------------- timing
class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn):
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end), out
        t0 = time.perf_counter()
        out = fn()
        # CPU ops run eagerly: the step is done when train_step returns; .item() is ~free
        return (time.perf_counter() - t0) * 1e3, out


def nparams(model):
    return sum(p.numel() for p in model.parameters())


def step_flops(a, tokens):
    """Model FLOPs per step (fwd + bwd = 3x fwd), matmuls only, causal attention not halved."""
    h, L, f, V, s = a.hidden, a.layers, a.ffn, a.vocab, a.seq
    per_token_fwd = L * (2 * h * 3 * h + 2 * h * h + 2 * 2 * h * f + 2 * 2 * s * h) + 2 * h * V
    return 3 * per_token_fwd * tokens


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=None, help="MLP hidden size (default 4 x hidden)")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096, help="a multiple of 128 (no vocab padding)")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--num-micro", type=int, default=1, help="microbatches per step (grad accumulation)")
    p.add_argument("--rounds", type=int, default=6, help="timed rounds")
    p.add_argument("--steps-per-round", type=int, default=3,
                   help="steps of each model per round, interleaved A B A B ...")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each model first")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--baseline-optim", default="foreach", choices=["foreach", "fused", "default"],
                   help="AdamW implementation of the baseline")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--profile", default=None, choices=["ours", "baseline", "both"],
                   help="after timing, print a torch.profiler op table for a few steps")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--no-write", action="store_true", help="do not write bench/results/*.md")
    p.add_argument("--append", action="store_true",
                   help="append this run to the results file instead of overwriting it")
    p.add_argument("--out", default=None, help="results file (default bench/results/overhead_<device>[_<dtype>].md)")
    a = p.parse_args(argv)
    a.ffn = a.ffn or 4 * a.hidden
    if a.vocab % 128:
        p.error(f"--vocab {a.vocab} is not a multiple of 128: our vocab padding would change the shapes")
    if a.hidden % a.heads:
        p.error("--hidden must be divisible by --heads")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dtype = DTYPES[a.dtype]

    # ---- ours
    groups = init_world_of_one(device, "nccl" if device.type == "cuda" else "gloo")
    model_parallel_seed(a.seed, groups.tp_rank, groups.pp_rank, device)
    cfg = TransformerConfig(num_layers=a.layers, hidden_size=a.hidden, num_attention_heads=a.heads,
                            ffn_hidden_size=a.ffn, seq_length=a.seq, hidden_dropout=0.0,
                            attention_dropout=0.0, params_dtype=dtype)
    cfg.vocab_size = a.vocab
    cfg.validate()
    assert cfg.padded_vocab_size == a.vocab
    ours = GPTModel(cfg, groups, pre_process=True, post_process=True, device=device)
    initialize_parameters(ours, a.seed, groups.tp_rank, groups.tp_size)
    decay_iters = 10 * (a.warmup + a.rounds * a.steps_per_round + a.profile_steps + 10)
    betas, eps = (0.9, 0.95), 1e-8
    ours_ddp = DistributedDataParallel(ours, groups.dp, gradient_accumulation_fusion=cfg.gradient_accumulation_fusion)
    ours_opt = MegatronOptimizer(ours_ddp, groups, a.lr, a.weight_decay, betas, eps, a.clip_grad)
    ours_sched = LRScheduler(ours_opt, a.lr, a.min_lr, decay_iters, 2, "cosine")
    ours.train()

    # ---- baseline, same starting weights
    torch.manual_seed(a.seed)
    base = BaselineGPT(a.vocab, a.seq, a.hidden, a.heads, a.ffn, a.layers).to(device=device, dtype=dtype)
    copy_ours_into_baseline(ours, base)
    base_opt = baseline_optimizer(base, a.lr, a.weight_decay, betas, eps, a.baseline_optim)
    base_sched = LRScheduler(base_opt, a.lr, a.min_lr, decay_iters, 2, "cosine")  # get_lr only
    base.train()

    n_ours, n_base = nparams(ours), nparams(base)
    print(f"parameters: ours {n_ours:,}  baseline {n_base:,}")
    if n_ours != n_base:
        sys.exit(f"parameter counts differ ({n_ours} vs {n_base}): the models do not do the same FLOPs")
    shapes_ours = sorted(tuple(q.shape) for q in ours.parameters())
    shapes_base = sorted(tuple(q.shape) for q in base.parameters())
    assert shapes_ours == shapes_base, "parameter shapes differ"

    # ---- fixed random data (not timed: the data pipeline is not what we measure)
    gen = torch.Generator().manual_seed(a.seed)
    batches = []
    for _ in range(a.num_micro):
        t = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=gen).to(device)
        batches.append({"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous(),
                        "loss_mask": torch.ones(a.micro_batch, a.seq, dtype=torch.float32, device=device)})
    tokens_per_step = a.micro_batch * a.seq * a.num_micro

    it = {"ours": 0, "base": 0}

    def run_ours():
        it["ours"] += 1
        return train_step(ours, ours_ddp, ours_opt, ours_sched, batches, forward_step, groups, it["ours"])

    def run_base():
        it["base"] += 1
        return baseline_step(base, base_opt, base_sched, batches, it["base"], a.clip_grad)

    timer = Timer(device)
    runs = {"ours": run_ours, "baseline": run_base}

    # ---- warm-up, also the same-function check: same weights + same data -> same losses
    print(f"warm-up: {a.warmup} steps each (untimed)")
    for k in range(a.warmup):
        losses, no, _, _ = run_ours()
        lo = loss_means(losses)["lm loss"]
        lb, nb, _ = run_base()
        lo, no, lb, nb = (float(x) for x in (lo, no, lb, nb))
        print(f"  step {k + 1}: loss ours {lo:.5f} baseline {lb:.5f} | grad norm ours {no:.5f} baseline {nb:.5f}")
        tol = 2e-3 if dtype == torch.float32 else 5e-2
        if abs(lo - lb) > tol * max(1.0, abs(lb)):
            sys.exit("losses differ: the two models do not compute the same function")

    # ---- timed, interleaved
    times = {"ours": [], "baseline": []}
    t_start = time.perf_counter()
    for r in range(a.rounds):
        order = ["ours", "baseline"] if r % 2 == 0 else ["baseline", "ours"]
        for _ in range(a.steps_per_round):
            for name in order:
                ms, _ = timer(runs[name])
                times[name].append(ms)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"round {r + 1}/{a.rounds}: median so far ours {med['ours']:.1f} ms, "
              f"baseline {med['baseline']:.1f} ms, ratio {med['ours'] / med['baseline']:.3f}")
    wall = time.perf_counter() - t_start

    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["ours"] / med["baseline"]
    # ratio of paired steps (ours step i vs baseline step i, run back to back): robust to drift
    paired = statistics.median(o / b for o, b in zip(times["ours"], times["baseline"]))
    flops = step_flops(a, tokens_per_step)

    def row(name, n):
        v = times[name]
        return (f"| {name} | {n:,} | {med[name]:.1f} | {min(v):.1f} | {max(v):.1f} | "
                f"{tokens_per_step / med[name] * 1e3:,.0f} | {flops / med[name] / 1e6:.1f} |")

    table = "\n".join([
        "| model | params | median ms/step | min | max | tokens/s | model GFLOP/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
        row("ours", n_ours),
        row("baseline", n_base),
    ])
    verdict = "OK" if ratio <= 1.05 else "ABOVE TARGET"
    summary = (f"ratio ours/baseline (medians): {ratio:.3f}   median of paired ratios: {paired:.3f}   "
               f"target <= 1.05: {verdict}")
    print()
    print(table)
    print(summary)

    cmd = "PYTHONPATH=. python " + " ".join(
        [os.path.relpath(sys.argv[0])] + (argv if argv is not None else sys.argv[1:]))
    dev_name = torch.cuda.get_device_name(0) if device.type == "cuda" else \
        f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    md = "\n".join([
        f"# Framework overhead: ours vs. plain PyTorch GPT ({a.device}, {a.dtype})",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- torch: {torch.__version__}, python {platform.python_version()}",
        f"- device: {dev_name}",
        f"- command: `{cmd}`",
        f"- shapes: layers {a.layers}, hidden {a.hidden}, heads {a.heads}, ffn {a.ffn}, seq {a.seq}, "
        f"vocab {a.vocab}, micro batch {a.micro_batch} x {a.num_micro} microbatch(es) "
        f"= {tokens_per_step} tokens/step, dtype {a.dtype}, dropout 0",
        f"- parameters: ours {n_ours:,}, baseline {n_base:,} (equal; same initial weights, "
        f"warm-up losses agree)",
        "- ours: GPTModel + initialize_parameters + DistributedDataParallel (contiguous grad buffer)"
        " + MegatronOptimizer (fused AdamW) + LRScheduler + megatron.training.training.train_step",
        f"- baseline: nanoGPT-style single-file model, torch.optim.AdamW ({a.baseline_optim}), "
        f"clip_grad_norm_(foreach)",
        f"- timing: {a.warmup} warm-up steps each excluded, then {a.rounds} rounds x "
        f"{a.steps_per_round} steps, interleaved (order flipped each round); {wall:.0f} s timed",
        "",
        table,
        "",
        f"**{summary}**",
        "",
    ])
    if not a.no_write:
        out = a.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                    f"overhead_{a.device}" + ("" if a.dtype == "fp32" else f"_{a.dtype}") + ".md")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "a" if a.append else "w") as f:
            f.write(("\n" if a.append and f.tell() else "") + md)
        print(f"wrote {out}")

    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        names = ["ours", "baseline"] if a.profile == "both" else [{"ours": "ours", "baseline": "baseline"}[a.profile]]
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        for name in names:
            with profile(activities=acts) as prof:
                for _ in range(a.profile_steps):
                    timer(runs[name])
            print(f"\n==== profile: {name} ({a.profile_steps} steps), sorted by {sort}")
            print(prof.key_averages().table(sort_by=sort, row_limit=30))

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
