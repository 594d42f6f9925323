"""Activation offload on CUDA (pinned host memory, side stream): the device's peak memory over the forward
falls by what the hooks hold on the host, the gradients are bitwise those without offload, and the step
times (printed) show the reload's cost. A 4-layer bf16 block, 3 layers offloaded."""
import time

import torch

from megatron.core.config import TransformerConfig
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer.activation_offload import ActivationOffloader
from megatron.core.transformer.block import TransformerBlock
from tests.harness import spawn

S, B, H, A = 1024, 4, 1024, 8


def _run(groups, offload):
    cfg = TransformerConfig(num_layers=4, hidden_size=H, num_attention_heads=A, seq_length=S, hidden_dropout=0.0,
                            attention_dropout=0.0, params_dtype=torch.bfloat16, vocab_size=64)
    cfg.resolve().validate()
    model_parallel_seed(1, 0, 0, "cuda")
    block = TransformerBlock(cfg, groups, post_process=False, device="cuda").train()
    g = torch.Generator(device="cuda").manual_seed(5)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g, device="cuda") * 0.02)
    offloader = ActivationOffloader(torch.device("cuda"))
    if offload:
        block.offload_first(offloader, 3)
    x = torch.randn(S, B, H, generator=g, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    times = []
    for _ in range(4):
        x.grad = None
        for p in block.parameters():
            p.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        y = block(x)
        torch.cuda.synchronize()
        forward_peak = torch.cuda.max_memory_allocated() - base
        y.float().square().sum().backward()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return forward_peak, offloader.peak, offloader.held, min(times), [x.grad.cpu()] + [p.grad.cpu()
                                                                                      for p in block.parameters()]


def _both(groups):
    return _run(groups, False), _run(groups, True)


def test_offload_lowers_the_device_peak_by_what_the_host_holds():
    (peak, _, _, t_plain, grads), (peak_off, host, held, t_off, grads_off) = spawn(1, _both)[0]
    print(f"forward peak {peak:,} -> {peak_off:,} bytes (host holds {host:,}); step {t_plain * 1e3:.2f} -> "
          f"{t_off * 1e3:.2f} ms")
    assert held == 0
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_off))
    assert peak - peak_off >= 0.7 * host > 0  # the allocator frees a copied storage once its copy event is done
