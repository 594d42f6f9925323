"""MoE against dense, and the all-to-all volume against its formula, measured in the same run.

    python bench/moe.py              # seed 004's MoE (8 experts, top-2, 384 x 6L x 8H, seq 1024) on CPU
    python bench/moe.py --seq 256    # shorter sequences, quicker

1. Tokens/s of one process training the MoE model and a dense model with the same active
   parameters (dense ffn = top-k x expert ffn), steps alternating A B A B so load hits both alike.
2. All-to-all bytes per step at EP=2 (2 processes, --moe-token-dispatcher-type alltoall), counted at
   the collective, against the formula: every (token, choice) pair routed to an expert on the other
   rank crosses once forward to the expert and once back, and both again in backward:
   4 x h x bytes per element x remote pairs; with even routing remote pairs = T k (EP-1)/EP per
   layer and micro-batch. Writes the table to bench/results/moe_cpu.md.
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
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer.moe import token_dispatcher
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from tests.harness import free_port


def _step(model, batch):
    return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}


def _config(a, moe, ep=1):
    kw = dict(num_layers=6, hidden_size=384, num_attention_heads=8, seq_length=a.seq, vocab_size=a.vocab,
              hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=False)
    if moe:
        return TransformerConfig(**kw, ffn_hidden_size=1536, num_experts=8, moe_router_topk=2,
                                 moe_aux_loss_coeff=1e-2, moe_token_dispatcher_type="alltoall",
                                 moe_grouped_gemm=True, expert_model_parallel_size=ep)
    return TransformerConfig(**kw, ffn_hidden_size=2 * 1536)


def _setup(a, cfg, groups, world):
    t = TrainingConfig(micro_batch_size=a.micro_batch, global_batch_size=a.micro_batch * world, mock_data=True,
                       tokenizer_type="NullTokenizer", null_vocab_size=a.vocab, train_iters=100, lr=1e-4,
                       lr_warmup_iters=0)
    t.validate(world)
    model_parallel_seed(1, 0, 0, torch.device("cpu"))
    return setup_model_and_optimizer(cfg, t, groups, torch.device("cpu"),
                                     lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))


def _batch(a, rank):
    tok = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=torch.Generator().manual_seed(rank))
    return [{"tokens": tok[:, :-1], "labels": tok[:, 1:], "loss_mask": torch.ones(a.micro_batch, a.seq)}]


def _worker(rank, world, a, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = initialize_model_parallel(1, 1, expert_model_parallel_size=world)
    batches = _batch(a, rank)
    if world == 1:  # throughput, MoE against dense
        runs = {"moe": _setup(a, _config(a, True), groups, 1), "dense": _setup(a, _config(a, False), groups, 1)}
        times = {k: [] for k in runs}
        for r in range(a.warmup + a.rounds):
            for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                t0 = time.perf_counter()
                train_step(*runs[name], batches, _step, groups, r + 1)
                if r >= a.warmup:
                    times[name].append(time.perf_counter() - t0)
        params = {k: sum(p.numel() for p in v[0].parameters()) for k, v in runs.items()}
        out.put(("speed", times, params))
    else:  # all-to-all bytes at EP = world
        sent, pairs = [0], [0]
        real = dist.all_to_all_single

        def counting(output, inp, out_splits=None, in_splits=None, group=None):
            if inp.dim() == 2:  # tokens (not the counts): bytes leaving for the other ranks
                me = dist.get_rank(group)
                splits = in_splits or [inp.shape[0] // world] * world
                sent[0] += (sum(splits) - splits[me]) * inp.shape[1] * inp.element_size()
            return real(output, inp, out_splits, in_splits, group=group)
        token_dispatcher.dist.all_to_all_single = counting
        model, ddp, opt, sched = _setup(a, _config(a, True, world), groups, world)
        original = token_dispatcher.AllToAllDispatcher.dispatch

        def dispatch(self, x, probs, indices, *rest):
            local = (indices // self.count) == dist.get_rank(self.group)
            pairs[0] += int((~local).sum())
            return original(self, x, probs, indices, *rest)
        token_dispatcher.AllToAllDispatcher.dispatch = dispatch
        train_step(model, ddp, opt, sched, batches, _step, groups, 1)
        out.put(("bytes", rank, sent[0], pairs[0]))
    dist.destroy_process_group()


def _spawn(world, a):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, a, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = [out.get(timeout=3600) for _ in range(1 if world == 1 else world)]
    for p in procs:
        p.join()
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    (_, times, params), = _spawn(1, a)
    tokens = a.seq * a.micro_batch
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [f"| {k} | {params[k] / 1e6:.1f}M | {med[k] * 1000:.0f} | {tokens / med[k]:.0f} |" for k in med]
    table = "\n".join(["| model | params | median ms/step | tokens/s |", "|---|---:|---:|---:|"] + rows)
    ratio = f"tokens/s MoE / dense (same active params): {med['dense'] / med['moe']:.3f}"
    got = _spawn(2, a)
    h, layers, k, E = 384, 6, 2, 8
    measured = sum(r[2] for r in got)
    remote = sum(r[3] for r in got)
    exact = 4 * h * 4 * remote
    even = 2 * 4 * h * 4 * layers * tokens * k * (E // 2) // E  # both ranks, even routing
    bytes_table = "\n".join([
        "| all-to-all bytes per step (EP=2, both ranks) | value |", "|---|---:|",
        f"| measured at the collective | {measured:,} |",
        f"| formula 4 x h x 4 B x remote pairs ({remote:,} pairs routed) | {exact:,} |",
        f"| formula with even routing, 4 x h x 4 B x T k (EP-1)/EP x layers x ranks | {even:,} |"])
    print(table + "\n" + ratio + "\n\n" + bytes_table)
    if not a.no_write:
        path = os.path.join(os.path.dirname(__file__), "results", "moe_cpu.md")
        with open(path, "a") as f:
            f.write(f"\n## {datetime.date.today()} seed-004 MoE on CPU\n\n- command: `python {' '.join(sys.argv)}`\n"
                    f"- torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPU cores, "
                    f"{a.threads} thread(s); seq {a.seq}, micro batch {a.micro_batch}, vocab {a.vocab}, fp32; "
                    f"{a.rounds} timed rounds after {a.warmup} warm-up\n\n{table}\n\n**{ratio}**\n\n{bytes_table}\n")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
