"""Data-parallel sharding strategies against torch FSDP2 (fully_shard), in the same run.

    python bench/zero.py                       # DP=2 on CPU (gloo), 1 thread per rank
    python bench/zero.py --layers 8 --hidden 768 --rounds 10

Each variant trains the same GPT (our GPTModel, same init, same batches) on its own fresh process
group, so the peak memory of one does not hide another's: no_shard, optim (ZeRO-1), optim_grads
(ZeRO-2), optim_grads_params (ZeRO-3), all with --overlap-grad-reduce (and parameter-gather overlap
where it applies), and FSDP2 (fully_shard on every transformer layer and on the model; torch's
fused AdamW with ours' settings; FSDP2 averages gradients over DP, ours sums losses normalised by
the global batch: the same update). Per variant: median step time; bytes held between steps by rank 0
(parameters, gradients, optimizer state, counted from the live tensors); peak resident memory of
rank 0 over the timed steps (Linux VmHWM, reset after the warm-up) above its resident memory before
the model was built: weights, activations and allocator slack.
Prints the table with ratios to FSDP2 and writes it to bench/results/zero_cpu.md.
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_state import initialize_model_parallel
from megatron.core.pipeline_parallel import loss_means
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import initialize_parameters, setup_model_and_optimizer, train_step
from tests.harness import free_port

VARIANTS = ("no_shard", "optim", "optim_grads", "optim_grads_params", "fsdp2")


def _rss(field="VmRSS"):
    """This process's resident memory (VmRSS) or its peak since the last _reset_peak (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: VmHWM starts again from the current resident memory


def _config(a):
    return TransformerConfig(num_layers=a.layers, hidden_size=a.hidden, num_attention_heads=a.heads,
                             seq_length=a.seq, vocab_size=a.vocab, hidden_dropout=0.0, attention_dropout=0.0)


def _ours(a, groups, strategy):
    t = TrainingConfig(micro_batch_size=a.micro_batch, global_batch_size=a.micro_batch * a.dp, mock_data=True,
                       tokenizer_type="NullTokenizer", null_vocab_size=a.vocab, train_iters=100, lr=1e-4,
                       lr_warmup_iters=0, lr_decay_style="constant", data_parallel_sharding_strategy=strategy,
                       overlap_grad_reduce=True,
                       overlap_param_gather=strategy != "no_shard", ddp_bucket_size=a.bucket_size)
    t.resolve_sharding()
    model, ddp, opt, sched = setup_model_and_optimizer(_config(a), t, groups, torch.device("cpu"),
                                                       lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))

    def step(batch, i):
        return float(loss_means(train_step(model, ddp, opt, sched, [batch], _loss_terms, groups, i)[0])["lm loss"])

    def held():
        return sum(ddp.memory_bytes()) + opt.memory_bytes()
    return step, held


def _loss_terms(model, batch):
    return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}


def _fsdp2(a, groups):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = GPTModel(_config(a), groups, device="cpu")
    initialize_parameters(model, TrainingConfig.seed, 0, 1)  # the default seed, as ours
    mesh = init_device_mesh("cpu", (a.dp,))
    for layer in model.decoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # ours' AdamW: the same lr, betas, eps and decay, not applied to biases and norms
    decay = [p for p in model.parameters() if p.dim() > 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": [p for p in model.parameters() if p.dim() <= 1], "weight_decay": 0.0}],
                            lr=1e-4, fused=True)

    def step(batch, i):
        opt.zero_grad(set_to_none=True)
        # FSDP2 averages the gradients over DP: the local mean gives the global batch's mean
        loss = model(batch["tokens"], labels=batch["labels"]).sum() / batch["loss_mask"].numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return float(total) / a.dp  # the global batch's mean, as ours reports

    def held():
        local = [p.to_local() for p in model.parameters()]
        grads = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
        states = [v.to_local() if hasattr(v, "to_local") else v for s in opt.state.values() for v in s.values()
                  if torch.is_tensor(v) and v.dim() > 0]
        return sum(t.numel() * t.element_size() for t in local + grads + states)
    return step, held


def _worker(rank, a, variant, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.dp)
    groups = initialize_model_parallel(1, 1)
    model_parallel_seed(1, 0, 0, torch.device("cpu"))
    before = _rss()
    step, held = _fsdp2(a, groups) if variant == "fsdp2" else _ours(a, groups, variant)
    gen = torch.Generator().manual_seed(rank)
    times, losses = [], []
    for i in range(a.warmup + a.rounds):
        tok = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=gen)
        batch = {"tokens": tok[:, :-1], "labels": tok[:, 1:], "loss_mask": torch.ones(a.micro_batch, a.seq)}
        dist.barrier()
        t0 = time.perf_counter()
        losses.append(step(batch, i + 1))
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        if i == a.warmup - 1:
            _reset_peak()  # the timed steps' peak, not the set-up's (ZeRO-3 holds the initial values until then)
    peak = _rss("VmHWM") - before
    if rank == 0:
        out.put({"times": times, "held": held(), "peak": peak, "loss": losses[-1], "first": losses[0]})
    dist.destroy_process_group()


def run_variant(a, variant):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, a, variant, port, out)) for r in range(a.dp)]
    for pr in procs:
        pr.start()
    result = out.get(timeout=3600)
    for pr in procs:
        pr.join()
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default in (("--dp", 2), ("--layers", 4), ("--hidden", 512), ("--heads", 8), ("--seq", 128),
                          ("--vocab", 8192), ("--micro-batch", 2), ("--bucket-size", 1_000_000), ("--threads", 1),
                          ("--warmup", 2), ("--rounds", 6)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    # glibc raises its mmap threshold after large frees, then keeps freed blocks resident: fix it, so
    # that a released bucket (ZeRO-3, FSDP2) leaves the resident set (read at each rank's start)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 17))
    res = {v: run_variant(a, v) for v in VARIANTS}
    med = {v: statistics.median(r["times"]) * 1000 for v, r in res.items()}
    f = res["fsdp2"]
    rows = ["| variant | median ms/step | / FSDP2 | held bytes (rank 0) | / FSDP2 | peak RSS rise MiB | / FSDP2 "
            "| first loss | last loss |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for v, r in res.items():
        rows.append(f"| {v} | {med[v]:.1f} | {med[v] / med['fsdp2']:.2f} | {r['held']:,} | {r['held'] / f['held']:.2f}"
                    f" | {r['peak'] / 2**20:.1f} | {r['peak'] / f['peak']:.2f} | {r['first']:.4f} | {r['loss']:.4f} |")
    table = "\n".join(rows)
    params = a.layers * 12 * a.hidden ** 2 + a.vocab * a.hidden
    print(table)
    if not a.no_write:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "zero_cpu.md")
        with open(path, "a") as fh:
            fh.write(f"\n## {datetime.date.today()} DP={a.dp} on CPU (gloo)\n\n"
                     f"- command: `python {' '.join(sys.argv)}`\n"
                     f"- torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPU cores "
                     f"(shared with other jobs), MALLOC_MMAP_THRESHOLD_={os.environ['MALLOC_MMAP_THRESHOLD_']}\n"
                     f"- model: {a.layers} layers, hidden {a.hidden}, seq {a.seq}, vocab "
                     f"{a.vocab} (~{params / 1e6:.1f}M params), micro batch {a.micro_batch}, fp32, buckets of "
                     f"{a.bucket_size:,} elements (ours), {a.rounds} timed steps after {a.warmup} warm-up\n\n"
                     f"{table}\n")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
