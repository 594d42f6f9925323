"""One training step of seed 004's MoE model (or the dense model of the same depth): time, host syncs, ops.

    PYTHONPATH=. python bench/moe_step.py                          # tiny shape, CPU fp32: ms, syncs, ops per step
    PYTHONPATH=. python bench/moe_step.py --model dense            # the dense model of the same depth
    PYTHONPATH=. python bench/moe_step.py --shape seed004 --device cuda --dtype bf16 --profile /tmp/moe_trace
    PYTHONPATH=. python bench/moe_step.py --json out.json          # the figures as JSON (the GPU suite's form)

A world of one, the real path: GPTModel from TransformerConfig, DDP, the Megatron optimizer, the LR
schedule and training.train_step (every microbatch, the MoE step hooks, clipping, optimizer step), as
pretrain_gpt.py runs it with examples/moe/train_moe_seed004.sh's flags (8 experts top-2, aux and z
losses, alltoall dispatcher, grouped GEMM, no linear biases). Fixed random tokens: the data pipeline
is not measured. Syncs and ops are counted on one step by bench/host_syncs.py (what would make the
host wait for a GPU, and every aten op dispatched: each costs host time, which at this size is the
step on a GPU). Each timed step reports its wall time and the main thread's CPU time (on a shared
machine the latter is the steadier figure; on a GPU it is the host's share). --profile writes a
torch.profiler trace (chrome JSON) of the timed steps there.
"""
import argparse
import dataclasses
import datetime
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.host_syncs import HostSyncs  # noqa: E402
from megatron.core.config import TransformerConfig  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.parallel_state import initialize_model_parallel  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_seed  # noqa: E402
from megatron.core.transformer.moe import step_hooks  # noqa: E402
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step


@dataclasses.dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    ffn: int
    seq: int
    vocab: int
    layers: int = 6
    micro_batch: int = 4
    microbatches: int = 4
    experts: int = 8
    topk: int = 2


SHAPES = {"seed004": Shape(hidden=384, heads=8, ffn=1536, seq=1024, vocab=50257),
          "tiny": Shape(hidden=64, heads=8, ffn=256, seq=128, vocab=1024),
          # next to no arithmetic: the step's CPU time is the host's cost of issuing it (as at small GPU shapes)
          "overhead": Shape(hidden=32, heads=4, ffn=64, seq=16, vocab=128)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def model_config(s: Shape, moe=True, **extra):
    """examples/moe/train_moe_seed004.sh's model at shape s; dense: the same depth, ffn x topk (same active)."""
    kw = dict(num_layers=s.layers, hidden_size=s.hidden, num_attention_heads=s.heads, seq_length=s.seq,
              max_position_embeddings=s.seq, vocab_size=s.vocab, hidden_dropout=0.0, attention_dropout=0.0,
              add_bias_linear=False)
    if not moe:
        return TransformerConfig(**kw, ffn_hidden_size=s.ffn * s.topk)
    moe_kw = dict(num_experts=s.experts, moe_router_topk=s.topk, moe_router_load_balancing_type="aux_loss",
                  moe_aux_loss_coeff=1e-2, moe_z_loss_coeff=1e-3, moe_token_dispatcher_type="alltoall",
                  moe_grouped_gemm=True)
    moe_kw.update(extra)
    return TransformerConfig(**kw, ffn_hidden_size=s.ffn, **moe_kw)


def init_world_of_one(device):
    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=5))
    return initialize_model_parallel(1, 1)


def build(cfg, s: Shape, groups, device, dtype, seed=1234):
    """(model, ddp, optimizer, scheduler, batches) for a world of one."""
    t = TrainingConfig(micro_batch_size=s.micro_batch, global_batch_size=s.micro_batch * s.microbatches,
                       mock_data=True, tokenizer_type="NullTokenizer", null_vocab_size=s.vocab, train_iters=1000,
                       lr=1e-4, lr_warmup_iters=0, clip_grad=1.0, bf16=dtype == torch.bfloat16, seed=seed)
    t.validate(1)
    cfg.params_dtype = t.params_dtype
    model_parallel_seed(seed, 0, 0, device)
    parts = setup_model_and_optimizer(cfg, t, groups, device, lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(s.microbatches):
        tok = torch.randint(0, s.vocab, (s.micro_batch, s.seq + 1), generator=gen).to(device)
        batches.append({"tokens": tok[:, :-1].contiguous(), "labels": tok[:, 1:].contiguous(),
                        "loss_mask": torch.ones(s.micro_batch, s.seq, device=device)})
    return (*parts, batches)


def forward_step(model, batch):
    return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}


class Runner:
    """Steps of one built model; step() returns its losses (device tensors: nothing read on the host)."""

    def __init__(self, cfg, s, groups, device, dtype):
        self.model, self.ddp, self.opt, self.sched, self.batches = build(cfg, s, groups, device, dtype)
        self.groups, self.iteration, self.device = groups, 0, device
        self.router_losses = step_hooks.bind(self.model)  # what the MoE layers record into, as the loop's

    def step(self):
        self.iteration += 1
        return train_step(self.model, self.ddp, self.opt, self.sched, self.batches, forward_step, self.groups,
                          self.iteration, model_cfg=self.model.config if hasattr(self.model, "config") else None,
                          router_losses=self.router_losses)

    def timed(self):
        """(wall ms, this thread's CPU ms) of one step. With one intra-op thread the CPU's work (backward
        too) runs on this thread, so its CPU time is the step's, whatever else loads the machine."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.thread_time()
        self.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - t0), 1e3 * (time.thread_time() - c0)


def count(runner):
    """HostSyncs of one step (after the first, which allocates optimizer state)."""
    with HostSyncs() as c:
        runner.step()
    return c


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--model", default="moe", choices=["moe", "dense"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-count", action="store_true", help="skip counting syncs and ops")
    p.add_argument("--profile", default=None, help="directory for a torch.profiler chrome trace of the timed steps")
    p.add_argument("--json", default=None, help="write the figures here as JSON")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    s = SHAPES[a.shape]
    groups = init_world_of_one(device)
    runner = Runner(model_config(s, a.model == "moe"), s, groups, device, DTYPES[a.dtype])
    for _ in range(a.warmup):
        runner.step()
    out = {"shape": dataclasses.asdict(s), "model": a.model, "device": str(device), "dtype": a.dtype,
           "torch": torch.__version__}
    if not a.no_count:
        c = count(runner)
        out.update(syncs_per_step=c.total_syncs, ops_per_step=c.total_ops, syncs=dict(c.syncs))
        print(f"host syncs per step: {c.total_syncs}, aten ops per step: {c.total_ops}")
        for line in c.report(top=6):
            print("  " + line)
    prof = None
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        prof = profile(activities=acts)
        prof.__enter__()
    times, cpu = zip(*[runner.timed() for _ in range(a.steps)])
    if prof is not None:
        prof.__exit__(None, None, None)
        os.makedirs(a.profile, exist_ok=True)
        path = os.path.join(a.profile, f"moe_step_{a.model}_{a.shape}_{device.type}.json")
        prof.export_chrome_trace(path)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        out["trace"] = path
    out.update(ms_per_step=statistics.median(times), ms_min=min(times), ms_max=max(times),
               host_cpu_ms_per_step=statistics.median(cpu), host_cpu_ms_min=min(cpu))
    print(f"{a.model} {a.shape} {device.type} {a.dtype}: median {out['ms_per_step']:.1f} ms/step "
          f"(min {out['ms_min']:.1f}, max {out['ms_max']:.1f}, {a.steps} steps after {a.warmup} warm-up); "
          f"this thread's CPU time {out['host_cpu_ms_per_step']:.1f} ms/step (min {out['host_cpu_ms_min']:.1f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
