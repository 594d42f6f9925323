"""How long a checkpoint save stalls training: synchronous against --async-save, on CPU.

    python bench/checkpoint_stall.py        # appends the table to bench/results/checkpoint_scale_cpu.md

One process (gloo, world 1) trains a GPT with the real optimizer and saves with the real
save_checkpoint every --every iterations, alternately without and with the background saver
(AsyncSaver). Per save: the time the training step was blocked in save_checkpoint, and the
extra time of the next --after iterations over the median iteration without a save nearby
(the background thread shares the CPU). Stall = blocked + that extra.
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.checkpointing import AsyncSaver
from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_state import initialize_model_parallel
from megatron.core.pipeline_parallel import loss_means
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.checkpointing.save_load import save_checkpoint
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step


def _step(model, batch):
    return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}


def measure(a, root):
    groups = initialize_model_parallel(1, 1)
    device = torch.device("cpu")
    cfg = TransformerConfig(num_layers=a.layers, hidden_size=a.hidden, num_attention_heads=a.heads, seq_length=a.seq,
                            vocab_size=a.vocab, hidden_dropout=0.0, attention_dropout=0.0)
    t = TrainingConfig(micro_batch_size=2, global_batch_size=2, mock_data=True, tokenizer_type="NullTokenizer",
                       null_vocab_size=a.vocab, train_iters=1000, lr=1e-4, save=root)
    t.validate(1)
    model_parallel_seed(1, 0, 0, device)
    model, ddp, opt, sched = setup_model_and_optimizer(cfg, t, groups, device,
                                                       lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))
    gen = torch.Generator().manual_seed(0)
    tok = torch.randint(0, a.vocab, (2, a.seq + 1), generator=gen)
    batches = [{"tokens": tok[:, :-1], "labels": tok[:, 1:], "loss_mask": torch.ones(2, a.seq)}]
    saver = AsyncSaver()
    times, saves = [], []  # iteration seconds; (iteration, mode, blocked seconds)
    for it in range(1, a.saves * a.every + a.every + 1):
        start = time.perf_counter()
        losses, *_ = train_step(model, ddp, opt, sched, batches, _step, groups, it)
        float(loss_means(losses)["lm loss"])
        times.append(time.perf_counter() - start)
        if it % a.every == 0 and it // a.every <= a.saves:
            mode = "async" if (it // a.every) % 2 == 0 else "sync"
            start = time.perf_counter()
            save_checkpoint(root, it, it * 2, model, opt, groups, cfg, t, device, sched,
                            saver if mode == "async" else None)
            saves.append((it, mode, time.perf_counter() - start))
    saver.wait()
    near = {s + k for s, _, _ in saves for k in range(1, a.after + 1)}
    base = statistics.median(x for i, x in enumerate(times, 1) if i not in near and i > 2)
    rows = {"sync": [], "async": []}
    for s, mode, blocked in saves:
        extra = sum(times[s + k - 1] - base for k in range(1, a.after + 1))
        rows[mode].append((blocked, extra))
    return base, rows


def append_result(title, details, table):
    """Append a dated section (command, versions, `details`, `table`) to the results file."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "checkpoint_scale_cpu.md")
    with open(path, "a") as f:
        f.write(f"\n## {datetime.date.today()} {title}\n\n- command: `python {' '.join(sys.argv)}`\n"
                f"- torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPU cores "
                f"(shared, busy)\n{details}\n\n{table}\n")
    print(f"written to {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--every", type=int, default=6, help="iterations between saves")
    p.add_argument("--after", type=int, default=3, help="iterations after a save whose slowdown counts")
    p.add_argument("--saves", type=int, default=6, help="saves, alternately sync and async")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as root:
        base, rows = measure(a, root)
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(root) for f in fs) / 2 ** 20
    dist.destroy_process_group()
    lines = ["| save | saves | blocked ms (median) | slowdown of the next iterations ms (median) | stall ms (median) |",
             "|---|---:|---:|---:|---:|"]
    for mode, r in rows.items():
        blocked, extra, stall = (statistics.median(f(b, e) for b, e in r) * 1e3
                                 for f in (lambda b, e: b, lambda b, e: e, lambda b, e: b + e))
        lines.append(f"| {mode} | {len(r)} | {blocked:.0f} | {extra:.0f} | {stall:.0f} |")
    table = "\n".join(lines)
    print(table)
    if not a.no_write:
        append_result("training stalled by a save, sync vs --async-save",
                      f"- model: {a.layers} layers, hidden {a.hidden}, seq {a.seq}, vocab {a.vocab}, fp32, 1 process; "
                      f"checkpoint directory {size:.0f} MiB (all kept saves); median iteration without a save "
                      f"{base * 1e3:.0f} ms; slowdown summed over the {a.after} iterations after each save", table)

if __name__ == "__main__":
    main()
