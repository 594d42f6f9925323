"""Ring attention's block kernels (ring_kernels.py), one process: which kernel serves which case; the
fused CUDA kernels' calls against this torch's op schemas (on the meta device); the log-sum-exp merge
and the blocks' backward from the merged output against whole attention in fp64; and the ring itself,
C ranks as threads (tests/ring_threads.py, which the GPU tests use), against one-process attention."""
import math

import pytest
import torch

from megatron.core.transformer.ring_attention import merge
from megatron.core.transformer.ring_kernels import BlockKernel, choose_kernel, usable_kernels
from tests.ring_threads import run_ring

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
ALL_CUDA = frozenset({"flash", "cudnn", "efficient", "math"})


@pytest.mark.parametrize("device, dtype, head_dim, usable, want", [
    ("cpu", BF16, 64, {"cpu_flash", "math"}, "cpu_flash"),
    ("cpu", FP64, 20, {"cpu_flash", "math"}, "cpu_flash"),  # the CPU kernel takes every dtype and head dim
    ("cpu", FP32, 64, {"math"}, "math"),  # a torch without it
    ("cuda", BF16, 64, ALL_CUDA, "flash"),
    ("cuda", FP16, 256, ALL_CUDA, "flash"),
    ("cuda", BF16, 64, ALL_CUDA - {"flash"}, "cudnn"),  # flash switched off (sdpa_kernel) or not built
    # the efficient kernel's half-precision backward is refused (ring_kernels.py): math instead
    ("cuda", BF16, 192, ALL_CUDA - {"flash"}, "math"),  # above cuDNN's 128
    ("cuda", BF16, 64, {"efficient", "math"}, "math"),  # before sm80
    ("cuda", BF16, 320, ALL_CUDA, "math"),  # above flash's 256
    ("cuda", FP32, 64, ALL_CUDA, "efficient"),  # the only fused kernel for fp32
    ("cuda", FP32, 20, ALL_CUDA, "efficient"),  # fp32: multiples of 4
    ("cuda", BF16, 20, ALL_CUDA, "math"),  # half: no kernel takes a head dim off multiples of 8
    ("cuda", FP64, 64, ALL_CUDA, "math"),
    ("cuda", BF16, 64, {"math"}, "math"),  # ROCm, or every SDPA kernel switched off
    ("xpu", BF16, 64, {"math"}, "math"),
])
def test_each_case_gets_its_kernel(device, dtype, head_dim, usable, want):
    assert choose_kernel(device, dtype, head_dim, frozenset(usable)) == want


def test_the_efficient_kernel_refuses_half_precision():
    q = torch.empty(1, 2, 8, 16, device="meta", dtype=BF16)
    with pytest.raises(ValueError, match="'efficient' takes float32 only"):
        BlockKernel("efficient").forward(q, q, q, 0.25, True)


def test_cpu_has_torchs_flash_kernel():
    assert usable_kernels("cpu") == {"cpu_flash", "math"}
    with pytest.raises(ValueError, match="ring attention kernel 'fast'"):
        BlockKernel("fast")


@pytest.mark.parametrize("name", ["flash", "efficient", "cudnn"])
@pytest.mark.parametrize("causal", [True, False])
def test_fused_kernels_call_their_ops_as_this_torch_declares_them(name, causal):
    """On the meta device the CUDA ops run their shape functions: the arguments must fit the schemas,
    and the wrappers must give back [b, h, sq, d] and a [b, h, sq] log-sum-exp (the efficient kernel's
    comes padded to 64 rows here, cuDNN's with a trailing 1) and gradients of the inputs' shapes."""
    b, h, g, sq, d = 2, 4, 2, 40, 16
    dt = FP32 if name == "efficient" else BF16  # the efficient kernel serves fp32 only
    q = torch.empty(b, h, sq, d, device="meta", dtype=dt)
    k, v = (torch.empty(b, g, sq, d, device="meta", dtype=dt) for _ in range(2))
    blocks = BlockKernel(name)
    out, lse = blocks.forward(q, k, v, 0.25, causal)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((b, h, sq, d), FP32, (b, h, sq), FP32)
    grads = blocks.backward(q, k, v, out.to(dt), torch.empty(b, h, sq, d, device="meta"), lse, 0.25, causal)
    assert [t.shape for t in grads] == [q.shape, k.shape, v.shape] and all(t.dtype == FP32 for t in grads)


def _block(q, k, v, scale, causal):
    """Reference for one block, written out: (out, lse) of softmax(q k^T scale (+ causal mask)) v."""
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def _inputs(sq, sk, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, n, 8, generator=gen, dtype=FP64) for n in (sq, sk, sk, sq)]


# key blocks (start, end, causal): unmasked blocks of uneven sizes; and the ring's causal case, the
# queries being the last 8 of 16 positions: the first 8 keys unmasked, the last 8 a square causal block
SPLITS = {"full-5-7-4": (16, [(0, 5, False), (5, 12, False), (12, 16, False)]),
          "causal-8-8": (8, [(0, 8, False), (8, 16, True)])}


def _whole_attention(q, k, v, scale, split):
    """The rows' attention over every key at once (the causal block's mask placed on the last keys)."""
    s = q @ k.transpose(-1, -2) * scale
    for lo, hi, causal in split:
        if causal:
            s[..., lo:hi] = s[..., lo:hi].masked_fill(torch.ones(hi - lo, hi - lo, dtype=torch.bool).triu(1),
                                                      float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("name", list(SPLITS))
def test_merged_blocks_are_whole_attention_forward_and_backward(name):
    """fp64: the blocks' (out, lse), merged by merge(), equal attention over all keys; so do the
    gradients through the merge (autograd), and the blocks' backward (each kernel on CPU) given the
    merged out and lse: dq summed over blocks, dk / dv each block's own."""
    sq, split = SPLITS[name]
    q, k, v, dout = _inputs(sq, 16)
    scale = 1 / math.sqrt(8)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    whole = _whole_attention(*leaves, scale, split)
    whole.backward(dout)
    want = [whole.detach()] + [t.grad for t in leaves]

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = lse = None
    for lo, hi, causal in split:
        o, s = _block(leaves[0], leaves[1][:, :, lo:hi], leaves[2][:, :, lo:hi], scale, causal)
        out, lse = (o, s) if out is None else merge(out, lse, o, s)
    out.backward(dout)
    torch.testing.assert_close(out.detach(), want[0], rtol=1e-12, atol=1e-12)
    for got, w in zip([t.grad for t in leaves], want[1:]):
        torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-12)

    for kernel in ("math", "cpu_flash"):
        blocks, dq, dk, dv = BlockKernel(kernel), torch.zeros_like(q), [], []
        for lo, hi, causal in split:
            g = blocks.backward(q, k[:, :, lo:hi], v[:, :, lo:hi], out.detach(), dout, lse.detach(), scale, causal)
            dq += g[0]
            dk.append(g[1])
            dv.append(g[2])
        for got, w in zip([dq, torch.cat(dk, 2), torch.cat(dv, 2)], want[1:]):
            torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cp", [2, 3])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", ["cpu_flash", "math"])
def test_ring_of_threads_is_one_process_attention(cp, causal, kernel):
    """fp64, GQA (4 heads, 2 groups), chunks of 3 rows: the ring of tests/ring_threads.py against
    attention over the whole sequence, forward and backward."""
    gen = torch.Generator().manual_seed(cp)
    S = 2 * cp * 3
    q, dout = (torch.randn(2, 4, S, 8, generator=gen, dtype=FP64) for _ in range(2))
    k, v = (torch.randn(2, 2, S, 8, generator=gen, dtype=FP64) for _ in range(2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=0.3, enable_gqa=True)
    ref.backward(dout)
    got = run_ring(q, k, v, dout, cp, 0.3, causal, kernel)
    for g, w in zip(got, [ref.detach()] + [t.grad for t in leaves]):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_start_up_log_names_the_ring_kernel():
    from megatron.core import fusions
    from megatron.core.config import TransformerConfig
    cfg = TransformerConfig(num_attention_heads=4, hidden_size=64, context_parallel_size=2)
    assert dict(fusions.describe(cfg, "cpu"))["ring-attention-blocks"] == "cpu_flash"
    assert "ring-attention-blocks" not in dict(fusions.describe(TransformerConfig(context_parallel_size=2,
                                                                                cp_comm_type="a2a"), "cpu"))
