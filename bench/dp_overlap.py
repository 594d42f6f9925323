"""Data-parallel step time with and without --overlap-grad-reduce, measured in the same run.

    python bench/dp_overlap.py                 # DP=2 on CPU (gloo), 1 thread per rank
    python bench/dp_overlap.py --device cuda   # DP=N GPUs (nccl), set --dp

Both variants train the same GPT with the same data; steps alternate (A B A B ...), the
order flipping each round, so load on the machine hits both alike. Prints the medians
and the ratio overlap / no-overlap and writes the table to bench/results/.
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
from megatron.training.loop.training import setup_model_and_optimizer, train_step


def _step(model, batch):
    return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}


def _worker(rank, a, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(a.threads)
    device = torch.device("cuda", rank) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=a.dp)
    groups = initialize_model_parallel(1, 1)
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    runs = {}
    for name, overlap in (("no overlap", False), ("overlap", True)):
        cfg = TransformerConfig(num_layers=a.layers, hidden_size=a.hidden, num_attention_heads=a.heads,
                                seq_length=a.seq, vocab_size=a.vocab, hidden_dropout=0.0,
                                attention_dropout=0.0, params_dtype=dtype)
        t = TrainingConfig(micro_batch_size=a.micro_batch, global_batch_size=a.micro_batch * a.dp * a.accum,
                           mock_data=True, tokenizer_type="NullTokenizer", null_vocab_size=a.vocab,
                           train_iters=200, lr=1e-3, min_lr=1e-4, lr_decay_style="cosine", lr_warmup_iters=20,
                           weight_decay=0.1, adam_beta2=0.95, overlap_grad_reduce=overlap,
                           ddp_bucket_size=a.bucket_size, bf16=a.bf16)
        t.validate(a.dp)
        model_parallel_seed(1, 0, 0, device)
        runs[name] = setup_model_and_optimizer(cfg, t, groups, device,
                                               lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))
    gen = torch.Generator().manual_seed(rank)
    batches = []
    for _ in range(a.accum):
        tok = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=gen).to(device)
        batches.append({"tokens": tok[:, :-1], "labels": tok[:, 1:],
                        "loss_mask": torch.ones(a.micro_batch, a.seq, device=device)})
    times = {k: [] for k in runs}
    order = list(runs)
    for r in range(a.warmup + a.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            model, ddp, opt, sched = runs[name]
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            losses, *_ = train_step(model, ddp, opt, sched, batches, _step, groups, r + 1)
            float(loss_means(losses)["lm loss"])
            if r >= a.warmup:
                times[name].append(time.perf_counter() - t0)
    if rank == 0:
        out.put(dict(times.items()))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--bucket-size", type=int, default=2_000_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_worker, args=(r, a, port, out)) for r in range(a.dp)]
    for pr in procs:
        pr.start()
    times = out.get(timeout=3600)
    for pr in procs:
        pr.join()
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    ratio = med["overlap"] / med["no overlap"]
    params = a.layers * 12 * a.hidden ** 2 + a.vocab * a.hidden
    table = "\n".join(["| variant | median ms/step | min | max |", "|---|---:|---:|---:|"] + [
        f"| {k} | {med[k]:.1f} | {min(v) * 1000:.1f} | {max(v) * 1000:.1f} |" for k, v in times.items()])
    summary = f"ratio overlap / no overlap (medians): {ratio:.3f}"
    print(table + "\n" + summary)
    if not a.no_write:
        os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
        path = os.path.join(os.path.dirname(__file__), "results", f"dp_overlap_{a.device}.md")
        with open(path, "a") as f:
            f.write(f"\n## {datetime.date.today()} DP={a.dp} on {a.device}\n\n"
                    f"- command: `python {' '.join(sys.argv)}`\n- torch {torch.__version__}, python "
                    f"{platform.python_version()}, {os.cpu_count()} CPU cores\n"
                    f"- model: {a.layers} layers, hidden {a.hidden}, seq {a.seq}, vocab {a.vocab} "
                    f"(~{params / 1e6:.1f}M "
                    f"params), micro batch {a.micro_batch} x {a.accum}, buckets of {a.bucket_size:,} elements, "
                    f"{'bf16' if a.bf16 else 'fp32'}; {a.rounds} timed rounds after {a.warmup} warm-up\n\n"
                    f"{table}\n\n**{summary}**\n")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
