"""The attention of one ring-attention block (ring_attention.py): its partial output with the rows'
log-sum-exp (for the merge), and its gradients given the rows' merged output and log-sum-exp.

Kernels (choose_kernel picks one per ring call from device, dtype and head dim):
  cpu_flash  torch's CPU flash attention (_scaled_dot_product_flash_attention_for_cpu), any dtype
  flash      CUDA FlashAttention-2 (_scaled_dot_product_flash_attention): fp16 / bf16, head dim a
             multiple of 8 up to 256, sm80 or later
  cudnn      cuDNN attention (_scaled_dot_product_cudnn_attention): fp16 / bf16, head dim a multiple
             of 8 up to 128, sm80 or later, cuDNN 9
  efficient  CUDA memory-efficient attention (_scaled_dot_product_efficient_attention): fp32 only,
             head dim a multiple of 4, sm50 or later. Its fp16 / bf16 backward, given the rows' merged
             log-sum-exp, gave non-finite dq on an H200 (torch 2.11, 2026-11-26; fp32 matched fp64 to
             1e-5), so half precision is refused here and falls back to the math kernel
  math       the scores written out in fp32 (fp64 stays fp64): any device, dtype and shape; the reference.
Each takes both kinds of block the ring has: a square causal one (the diagonal) and an unmasked one;
no row of a block is fully masked. A block of packed documents with any other pattern comes with its
bool mask [b, 1, rows, cols] (in place of the causal flag) and runs the math kernel, where a row that sees
none of the block's keys gets output 0 and log-sum-exp -inf (the merge then keeps the other blocks').
The fused kernels' output comes in the input dtype and is merged in fp32 (as the CPU kernel's); their
log-sum-exp is fp32. Their backward is the kernel's own, called with the rows' merged output and
log-sum-exp: dS = P (dP - rowsum(dO o O)) needs no more than that, so each
block's gradient is its part of the whole row's (as flash attention's own backward).
On CUDA the SDPA switches of torch.backends.cuda (torch.nn.attention.sdpa_kernel) are honoured.
"""
import torch
import torch.nn.functional as F

aten = torch.ops.aten
KERNELS = ("cpu_flash", "flash", "cudnn", "efficient", "math")
_HALF = (torch.float16, torch.bfloat16)
_LSE_ROWS = 32  # the efficient kernel's log-sum-exp comes padded to rows of 32, and is read so in backward


def _switch(name):
    """A torch.backends.cuda query (True where this torch lacks it: the kernel is then decided by the rest)."""
    fn = getattr(torch.backends.cuda, name, None)
    return True if fn is None else bool(fn())


def usable_kernels(device) -> frozenset:
    """The kernels of KERNELS this torch build and `device` can run (ROCm: math; its kernels lay out
    the log-sum-exp otherwise)."""
    device = torch.device(device)
    if device.type == "cpu":
        return frozenset({"math"} | ({"cpu_flash"} if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu")
                                     else set()))
    if device.type != "cuda" or torch.version.hip:
        return frozenset({"math"})
    sm = torch.cuda.get_device_capability(device)
    usable = {"math"}
    if sm >= (8, 0) and _switch("flash_sdp_enabled") and _switch("is_flash_attention_available"):
        usable.add("flash")
    if (sm >= (8, 0) and _switch("cudnn_sdp_enabled") and torch.backends.cudnn.is_available()
            and (torch.backends.cudnn.version() or 0) >= 90000):
        usable.add("cudnn")
    if sm >= (5, 0) and _switch("mem_efficient_sdp_enabled"):
        usable.add("efficient")
    return frozenset(usable)


def choose_kernel(device_type, dtype, head_dim, usable) -> str:
    """The kernel for ring blocks on `device_type` ('cpu', 'cuda', ...) with q / k / v of `dtype` and
    `head_dim`, among `usable` (usable_kernels). Flash first (measured on the GPU machine: what torch's
    SDPA picks there besides cuDNN, and the one whose ops are unchanged since torch 2.1), then cuDNN,
    then the efficient kernel for fp32 (the only fused one there; its half-precision backward is
    refused, see above), else the explicit math. The causal and
    the unmasked block are served by all of them alike, so the mask does not enter the choice."""
    if device_type == "cpu":
        return "cpu_flash" if "cpu_flash" in usable else "math"
    half = dtype in _HALF
    if half and head_dim % 8 == 0 and head_dim <= 256 and "flash" in usable:
        return "flash"
    if half and head_dim % 8 == 0 and head_dim <= 128 and "cudnn" in usable:
        return "cudnn"
    if dtype == torch.float32 and head_dim % 4 == 0 and "efficient" in usable:
        return "efficient"
    return "math"


def _expand(kv, heads):
    """[b, groups, s, d] -> [b, heads, s, d] (query head i uses group i // (heads / groups))."""
    return kv if kv.shape[1] == heads else kv.repeat_interleave(heads // kv.shape[1], dim=1)


def _fold(grad, groups):
    """The inverse of _expand for gradients: sum each group's heads."""
    b, heads, s, d = grad.shape
    return grad if heads == groups else grad.view(b, groups, heads // groups, s, d).sum(2)


def acc(t):
    """t in the accumulation dtype: fp32 for half precision (fp64 stays fp64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _scores(q, k, scale, causal):
    s = torch.matmul(acc(q), acc(k).transpose(-1, -2)) * scale
    if torch.is_tensor(causal):  # a packed-documents block's mask (True = may attend)
        return s.masked_fill(~causal, float("-inf"))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def _math_forward(q, k, v, scale, causal):
    s = _scores(q, k, scale, causal)
    lse = torch.logsumexp(s, dim=-1)
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # a row that sees no key: P = 0, not nan
    return torch.matmul(torch.exp(s - finite.unsqueeze(-1)), acc(v)), lse


def _math_backward(q, k, v, out, dout, lse, scale, causal):
    delta = (dout * acc(out)).sum(-1)
    ke, ve = acc(k), acc(v)
    p = torch.exp(_scores(q, ke, scale, causal) - lse.unsqueeze(-1))
    dv = torch.matmul(p.transpose(-1, -2), dout)
    ds = p * (torch.matmul(dout, ve.transpose(-1, -2)) - delta.unsqueeze(-1))
    return torch.matmul(ds, ke) * scale, torch.matmul(ds.transpose(-1, -2), acc(q)) * scale, dv


def _bhsd(t):
    """t contiguous as [b, h, s, d]: the layout cuDNN and the efficient kernel are given everything in
    (cuDNN's backward wants dO laid out as O)."""
    return t.contiguous()


class BlockKernel:
    """The blocks of one ring call through kernel `name` (KERNELS). A fused kernel's backward takes
    back tensors its forward returned besides out and lse (the dropout RNG state, unread at dropout 0;
    cuDNN's log-sum-exp rank, [b, h, s] or [b, h, s, 1] by torch version): the last forward's are kept."""

    def __init__(self, name):
        if name not in KERNELS:
            raise ValueError(f"ring attention kernel {name!r}: use one of {', '.join(KERNELS)}")
        self.name, self._extra = name, None

    def forward(self, q, k, v, scale, causal):
        """q [b, h, sq, d], k / v [b, g, sk, d] -> (out [b, h, sq, d], lse [b, h, sq]), in the accumulation dtype."""
        heads = q.shape[1]
        k, v = _expand(k, heads), _expand(v, heads)
        if self.name == "math" or torch.is_tensor(causal):
            return _math_forward(q, k, v, scale, causal)
        if self.name == "cpu_flash":
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        elif self.name == "flash":
            r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
            out, lse, self._extra = r[0], r[1], (r[6], r[7])
        elif self.name == "efficient":
            if q.dtype in _HALF:
                raise ValueError(f"ring attention kernel 'efficient' takes float32 only, got {q.dtype} "
                                 "(its half-precision backward from a merged log-sum-exp is wrong): use flash, "
                                 "cudnn or math")
            out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
                _bhsd(q), _bhsd(k), _bhsd(v), None, True, 0.0, causal, scale=scale)
            lse, self._extra = lse[..., :q.shape[2]], (seed, offset)
        else:
            r = aten._scaled_dot_product_cudnn_attention(_bhsd(q), _bhsd(k), _bhsd(v), None, True, 0.0, causal,
                                                         False, scale=scale)
            out, lse, self._extra = r[0], r[1], (r[6], r[7], r[1].dim())
            lse = lse.reshape(lse.shape[:3])
        return acc(out), acc(lse)

    def backward(self, q, k, v, out, dout, lse, scale, causal):
        """Gradients (dq, dk, dv) of one block, in the accumulation dtype, given the rows' final output
        out [b, h, sq, d] and log-sum-exp lse [b, h, sq] (over every block) and their gradient dout."""
        heads, groups = q.shape[1], k.shape[1]
        k, v = _expand(k, heads), _expand(v, heads)
        if self.name == "math" or torch.is_tensor(causal):
            dq, dk, dv = _math_backward(q, k, v, out, dout, lse, scale, causal)
            return dq, _fold(dk, groups), _fold(dv, groups)
        dout, out, lse = dout.to(q.dtype), out.to(q.dtype), acc(lse).contiguous()
        if self.name == "cpu_flash":
            grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out.contiguous(), lse, 0.0, causal, scale=scale)
        elif self.name == "flash":
            seed, offset = self._extra
            grads = aten._scaled_dot_product_flash_attention_backward(
                dout, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, seed, offset, scale=scale)
        elif self.name == "efficient":
            seed, offset = self._extra
            padded = F.pad(lse, (0, -lse.shape[-1] % _LSE_ROWS), value=float("inf"))  # rows past the end: P = 0
            grads = aten._scaled_dot_product_efficient_attention_backward(
                _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), None, _bhsd(out), padded, seed, offset, 0.0,
                [True, True, True, False], causal, scale=scale)
        else:
            seed, offset, dims = self._extra
            grads = aten._scaled_dot_product_cudnn_attention_backward(
                _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out), lse.view(lse.shape + (1,) * (dims - 3)),
                seed, offset, None, None, None, q.shape[2], k.shape[2], 0.0, causal, scale=scale)
        return acc(grads[0]), acc(_fold(grads[1], groups)), acc(_fold(grads[2], groups))
