"""One optimizer step, AdamW against Muon + AdamW, at the 1.3B GPT (the GPU suite's `--only muon`), and the
share of Muon's step that is Newton-Schulz, beside the planner's prediction of each.

    PYTHONPATH=. python bench/muon_step.py                                    # tiny shape, CPU fp32
    PYTHONPATH=. python bench/muon_step.py --shape gpt1.3b --device cuda --bf16

A world of one, the real optimizer (setup_model_and_optimizer, as pretrain_gpt.py builds it) on random
gradients: the forward and backward are not run. Newton-Schulz is timed by running Muon's
orthogonalisation of every matrix alone (muon.MuonRule._updates), the rest of the step is the momentum,
the AdamW part, the clip and the copies. Prints a RESULT line per optimizer (the suite's report form).
"""
import argparse
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

from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.optimizer.muon import MuonRule  # noqa: E402
from megatron.core.parallel_state import initialize_model_parallel  # noqa: E402
from megatron.training.loop.training import setup_model_and_optimizer  # noqa: E402
from megatron.training.planner import make_cluster  # noqa: E402
from megatron.training.planner.live import calibration_gpu  # noqa: E402
from megatron.training.planner.predict import configs, predict_resolved  # noqa: E402

SHAPES = {"tiny": "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 1000",
          "gpt1.3b": "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
                     "--max-position-embeddings 2048 --vocab-size 50304"}
RUN = "--mock-data --tokenizer-type NullTokenizer --lr 1e-4 --micro-batch-size 1 --train-iters 10"


def _init(device):
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=5))
    return initialize_model_parallel(1, 1)


def _timed(fn, device, steps, warmup):
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(flags, groups, device, steps, warmup):
    """{ms per optimizer step, Newton-Schulz ms (Muon), the planner's optimizer ms on this GPU}."""
    c, t = configs(flags, 1)
    model, ddp, opt, _ = setup_model_and_optimizer(c, t, groups, device,
                                                   lambda c_, g, d, **kw: GPTModel(c_, g, device=d, **kw))
    gen = torch.Generator(device=device).manual_seed(0)
    for buf in ddp.buffers:
        buf.grad_data.normal_(generator=gen).mul_(1e-3)
    out = {"ms_per_step": round(_timed(opt.step, device, steps, warmup), 2)}
    muon = [r for r in opt.rules if isinstance(r, MuonRule)]
    if muon:
        rule = muon[0]
        out["ns_ms"] = round(_timed(lambda: list(rule._updates(rule._directions())), device, steps, warmup), 2)
        out["ns_share"] = round(out["ns_ms"] / out["ms_per_step"], 3)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = calibration_gpu(props.name, props.total_memory)
        if gpu:
            out["planner_ms"] = round(1e3 * predict_resolved(c, t, 1, make_cluster(gpu, 1)).step.optimizer, 2)
        out["device"] = props.name
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
    del model, ddp, opt
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--muon-tp-mode", default="duplicated")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    groups = _init(device)
    base = (RUN + " " + SHAPES[a.shape] + (" --bf16" if a.bf16 else "")).split()
    rows = {}
    for name, extra in (("adam", []), ("muon", ["--optimizer", "muon", "--muon-tp-mode", a.muon_tp_mode])):
        rows[name] = measure(base + extra, groups, device, a.steps, a.warmup)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    for name, r in rows.items():
        print("RESULT " + json.dumps({"name": f"optimizer step {a.shape} {name}", **r}), flush=True)
    print(f"| optimizer ({a.shape}) | ms per step | Newton-Schulz ms | share | planner ms |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['ms_per_step']} | {r.get('ns_ms', '')} | {r.get('ns_share', '')} | "
              f"{r.get('planner_ms', '')} |")
    print(f"ratio muon / adam optimizer step: {rows['muon']['ms_per_step'] / rows['adam']['ms_per_step']:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
