"""A peer users would pick instead of us: HuggingFace transformers' GPT-2, trained the way its users do.

    PYTHONPATH=. python bench/peers.py --device cuda            # the GPT-3 1.3B shape of the GPU suite
    PYTHONPATH=. python bench/peers.py --layers 2 --hidden 64 --heads 4 --seq 64 --vocab 512 --micro-batch 2

GPT2LMHeadModel (sdpa attention, fp32 weights under bf16 autocast, fused AdamW, global-norm clipping,
gradient accumulation over --num-micro microbatches) at the same shape as our GPT, on fixed random
tokens. Its FLOPs per step are counted with our formula (megatron/training/observability/flops.py), so its
TFLOP/s and MFU compare with ours line for line. Prints one `RESULT {json}` line that
bench/gpu_suite.py reads, and the same as markdown. Needs `transformers` (not a dependency of ours).
"""
import argparse
import json
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from megatron.training.observability.flops import num_floating_point_operations, peak_tflops_per_gpu


def gpt_config_for_flops(a):
    """The fields num_floating_point_operations reads, for a GPT-2 block at this shape."""
    return SimpleNamespace(hidden_size=a.hidden, seq_length=a.seq, num_layers=a.layers, num_query_groups=a.heads,
                           num_attention_heads=a.heads, kv_channels=a.hidden // a.heads, ffn_hidden_size=4 * a.hidden,
                           swiglu=False, padded_vocab_size=a.vocab, num_experts=None)


def build_hf(a, device):
    from transformers import AutoModelForCausalLM, GPT2Config

    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.hidden, n_layer=a.layers, n_head=a.heads,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(a.seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(device)


def timed_steps(step, n, cuda):
    """ms of each of n calls of step(), with the device drained before and after each."""
    out = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--num-micro", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    try:
        import transformers
    except ImportError:
        sys.exit("bench/peers.py needs `transformers` (pip install transformers)")
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    model = build_hf(a, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda or None)
    gen = torch.Generator().manual_seed(a.seed)
    batches = [torch.randint(0, a.vocab, (a.micro_batch, a.seq), generator=gen).to(device)
               for _ in range(a.num_micro)]
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for tokens in batches:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = model(input_ids=tokens, labels=tokens).loss / len(batches)
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        losses.append(total)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timed_steps(step, a.warmup, cuda)
    ms = timed_steps(step, a.steps, cuda)
    med = statistics.median(ms)
    flops = num_floating_point_operations(gpt_config_for_flops(a), a.micro_batch * a.num_micro)
    peak = peak_tflops_per_gpu(device, torch.bfloat16) if cuda else None
    result = {"name": "HF GPT2LMHeadModel (sdpa, bf16 autocast, fused AdamW)", "transformers": transformers.__version__,
              "ms_per_step": round(med, 2), "min_ms": round(min(ms), 2), "max_ms": round(max(ms), 2),
              "tflops": round(flops / med / 1e9, 1), "mfu": round(flops / med / 1e9 / peak[1], 4) if peak else None,
              "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None,
              "params": sum(q.numel() for q in model.parameters()), "last_loss": float(losses[-1])}
    print("RESULT " + json.dumps(result))
    print(f"| {result['name']} | {med:.1f} ms/step | {result['tflops']} TFLOP/s | MFU {result['mfu']} | "
          f"peak {result['peak_mem_gib']} GiB |")


if __name__ == "__main__":
    main()
