"""Attention kernel fronts: dropout(softmax(q k^T / sqrt(d) + mask)) v, on [s, b, heads, d] tensors.

The module that picks among them per call (mask, dropout RNG, Transformer Engine's module) is
CoreAttention in megatron/core/transformer/core_attention.py. Backends (--attention-backend):
  auto     the first that fits of: flash-attn (CUDA, fp16/bf16), Transformer Engine's
           DotProductAttention (CUDA), torch SDPA;
  flash    flash-attn's flash_attn_func;       te   Transformer Engine's DotProductAttention;
  sdpa     torch.nn.functional.scaled_dot_product_attention (picks its own flash /
           memory-efficient / cuDNN / math kernel);
  fused    Megatron-LM's name for Transformer Engine's fused (cuDNN) attention: te where Transformer
           Engine is installed, else torch SDPA with its cuDNN backend first (the same cuDNN
           fused-attention kernels; "cudnn"), else, without CUDA, plain SDPA;
  unfused  explicit scores, the masked-softmax front (our kernel, apex or torch), dropout and
           a second matmul: Megatron-LM's "local" attention, the layer Korthikanti et al.
           count activations for (it keeps the s x s probabilities, the others do not).
flash and te take the causal mask only; with an explicit attn_mask CoreAttention uses SDPA.
Each function takes q [s, b, heads, d], k / v [sk, b, groups, d] and dropout p, and returns
[s, b, heads * d]; the caller forks the RNG tracker around dropout.
"""
import torch
import torch.nn.functional as F

from ..tensor_parallel.random import get_rng_tracker
from . import softmax as softmax_front
from ._common import HALF_DTYPES, importable

BACKENDS = ("auto", "flash", "te", "sdpa", "cudnn", "unfused")
# Megatron-LM's --attention-backend names: local is its own unfused layer (fused: select_fused)
ALIASES = {"local": "unfused"}
NAMES = {"flash": "flash-attn flash_attn_func", "te": "transformer_engine DotProductAttention",
         "sdpa": "torch scaled_dot_product_attention", "unfused": "unfused (matmul + masked softmax + matmul)",
         "cudnn": "torch scaled_dot_product_attention with its cuDNN backend first (--attention-backend fused "
                  "without Transformer Engine)"}


def available(backend, device, dtype):
    """Whether `backend` can run for this device and dtype; (ok, reason if not)."""
    backend = ALIASES.get(backend, backend)
    cuda = torch.device(device).type == "cuda"
    if backend == "flash":
        if not importable("flash_attn"):
            return False, "the flash-attn package is not installed"
        if not cuda or dtype not in HALF_DTYPES:
            return False, "flash-attn needs CUDA and fp16/bf16"
    elif backend == "te":
        if not importable("transformer_engine.pytorch"):
            return False, "Transformer Engine is not installed"
        if not cuda:
            return False, "Transformer Engine needs CUDA"
    return True, None


def select_fused(device, dtype):
    """Megatron-LM's --attention-backend fused: Transformer Engine's fused attention where it runs, else
    torch SDPA with cuDNN's fused attention first on CUDA, else (CPU) SDPA."""
    if available("te", device, dtype)[0]:
        return "te"
    return "cudnn" if torch.device(device).type == "cuda" else "sdpa"


def select(backend, device, dtype):
    """The backend CoreAttention uses: an explicit choice as given (Megatron-LM's names mapped), 'auto' resolved."""
    if backend == "fused":
        return select_fused(device, dtype)
    if backend != "auto":
        return ALIASES.get(backend, backend)
    for candidate in ("flash", "te"):
        if available(candidate, device, dtype)[0]:
            return candidate
    return "sdpa"


def sdpa(q, k, v, attn_mask, p):
    """torch SDPA; attn_mask None = causal, else SDPA's convention (bool True = attend, or additive)."""
    s, b, heads, d = q.shape
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # SDPA wants [b, heads, s, d]
    kwargs = dict(attn_mask=attn_mask, is_causal=attn_mask is None, dropout_p=p)
    if k.shape[1] != heads:
        kwargs["enable_gqa"] = True
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return out.permute(2, 0, 1, 3).reshape(s, b, heads * d)


def sdpa_cudnn(q, k, v, attn_mask, p):
    """torch SDPA with its cuDNN backend tried first (then flash, memory-efficient, math: SDPA falls back where
    cuDNN does not take the inputs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(order, set_priority=True):
        return sdpa(q, k, v, attn_mask, p)


def flash(q, k, v, p, scale):
    """flash-attn, causal only (CUDA, fp16/bf16)."""
    from flash_attn import flash_attn_func
    s, b, heads, d = q.shape
    out = flash_attn_func(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), dropout_p=p,
                          softmax_scale=scale, causal=True)  # [b, s, heads, d]
    return out.transpose(0, 1).reshape(s, b, heads * d)


def build_te(config, tp_group, layer_number):
    """Transformer Engine's DotProductAttention for this rank's heads, or None when this TE is too old."""
    import transformer_engine.pytorch as te
    tp = torch.distributed.get_world_size(tp_group) if tp_group is not None else 1
    try:
        return te.DotProductAttention(
            config.num_attention_heads, config.kv_channels, num_gqa_groups=config.num_query_groups,
            attention_dropout=config.attention_dropout, qkv_format="sbhd", attn_mask_type="causal",
            tp_size=tp, tp_group=tp_group, get_rng_state_tracker=get_rng_tracker, layer_number=layer_number)
    except TypeError:  # an older TE without these arguments: use SDPA rather than guess
        return None


def unfused(q, k, v, attn_mask, p, scale, softmax_impl, softmax_in_fp32=False, masked_softmax_impl=None):
    """Explicit scores, the masked-softmax front (softmax_impl from softmax.select(causal=True) for the causal
    mask, masked_softmax_impl from causal=False for a bool mask; default the same), dropout, matmul.
    softmax_in_fp32: half-precision scores go through torch's softmax in fp32 (the kernels already do)."""
    masked_softmax_impl = masked_softmax_impl or softmax_impl
    s, b, heads, d = q.shape
    sk, groups = k.shape[0], k.shape[2]
    if groups != heads:  # query head i uses key/value group i // (heads / groups), as SDPA's GQA
        k, v = (t.repeat_interleave(heads // groups, dim=2) for t in (k, v))
    # [b * heads, s, d] copies: what the two matmuls keep for backward (Q, K, V)
    q = q.permute(1, 2, 0, 3).reshape(b * heads, s, d)
    kt = k.permute(1, 2, 3, 0).reshape(b * heads, d, sk)
    v = v.permute(1, 2, 0, 3).reshape(b * heads, sk, d)
    scores = torch.bmm(q, kt).view(b, heads, s, sk)
    impl = softmax_impl if attn_mask is None else masked_softmax_impl
    if softmax_in_fp32 and scores.dtype in HALF_DTYPES and impl == "torch":
        scores = scores.float()
    if attn_mask is None:
        probs = softmax_front.scaled_upper_triang_masked_softmax(scores, scale, softmax_impl)
    elif attn_mask.dtype == torch.bool:
        # kernels take [b, 1, sq, sk]; a padding mask comes as [b, 1, 1, sk]
        masked = ~attn_mask.expand(attn_mask.shape[0], 1, s, sk)
        probs = softmax_front.scaled_masked_softmax(scores, masked, scale, masked_softmax_impl)
    else:
        probs = torch.softmax(scores * scale + attn_mask, dim=-1)
    probs = probs.to(v.dtype)
    if p > 0:
        probs = F.dropout(probs, p, True)
    out = torch.bmm(probs.view(b * heads, s, sk), v)
    return out.view(b, heads, s, d).permute(2, 0, 1, 3).reshape(s, b, heads * d)
