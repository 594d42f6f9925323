"""Core attention: dropout(softmax(q k^T / sqrt(d) + mask)) v, on [s, b, heads, d] tensors.

Backends (--attention-backend):
  auto     the first that fits of: flash-attn (CUDA, fp16/bf16), Transformer Engine's
           DotProductAttention (CUDA), torch SDPA;
  flash    flash-attn's flash_attn_func;       te   Transformer Engine's DotProductAttention;
  sdpa     torch.nn.functional.scaled_dot_product_attention (picks its own flash /
           memory-efficient / cuDNN / math kernel);
  unfused  explicit scores, the masked-softmax front (our kernel, apex or torch), dropout and
           a second matmul: Megatron-LM's "local" attention, the layer Korthikanti et al.
           count activations for (it keeps the s x s probabilities, the others do not).
flash and te take the causal mask only; with an explicit attn_mask they fall back to SDPA.
Dropout on attention probabilities draws from the tracker's model-parallel RNG (heads differ
per TP rank); flash-attn and SDPA read the device generator inside tracker.fork().
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..tensor_parallel.random import get_rng_tracker
from . import softmax as softmax_front
from ._common import HALF_DTYPES, importable

BACKENDS = ("auto", "flash", "te", "sdpa", "unfused")
NAMES = {"flash": "flash-attn flash_attn_func", "te": "transformer_engine DotProductAttention",
         "sdpa": "torch scaled_dot_product_attention", "unfused": "unfused (matmul + masked softmax + matmul)"}


def available(backend, device, dtype):
    """Whether `backend` can run for this device and dtype; (ok, reason if not)."""
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


def select(backend, device, dtype):
    """The backend CoreAttention uses: an explicit choice as given, 'auto' resolved."""
    if backend != "auto":
        return backend
    for candidate in ("flash", "te"):
        if available(candidate, device, dtype)[0]:
            return candidate
    return "sdpa"


class CoreAttention(nn.Module):
    """q [s, b, heads, d], k / v [s, b, groups, d] (heads a multiple of groups) -> [s, b, heads * d].

    attn_mask None means causal; otherwise SDPA's convention (bool True = attend, or an
    additive float mask) broadcastable to [b, heads, s, s]. No parameters.
    """

    def __init__(self, config, tp_group=None, layer_number=1, device=None):
        super().__init__()
        c = config
        dtype = c.params_dtype
        device = torch.device(device or "cpu")
        self.dropout = c.attention_dropout
        self.scale = 1.0 / math.sqrt(c.kv_channels)
        self.backend = select(c.attention_backend, device, dtype)
        self.softmax_impl = softmax_front.select(c.masked_softmax_fusion, device, dtype, causal=True)
        self.te_attention = None
        if self.backend == "te":
            self.te_attention = self._build_te(c, tp_group, layer_number)

    def _build_te(self, c, tp_group, layer_number):
        import transformer_engine.pytorch as te
        tp = torch.distributed.get_world_size(tp_group) if tp_group is not None else 1
        try:
            return te.DotProductAttention(
                c.num_attention_heads, c.kv_channels, num_gqa_groups=c.num_query_groups,
                attention_dropout=c.attention_dropout, qkv_format="sbhd", attn_mask_type="causal",
                tp_size=tp, tp_group=tp_group, get_rng_state_tracker=get_rng_tracker, layer_number=layer_number)
        except TypeError:  # an older TE without these arguments: use SDPA rather than guess
            self.backend = "sdpa"
            return None

    def describe(self):
        name = NAMES[self.backend]
        return name + (f", softmax={self.softmax_impl}" if self.backend == "unfused" else "")

    def forward(self, q, k, v, attn_mask=None):
        backend = self.backend
        if attn_mask is not None and backend in ("flash", "te"):
            backend = "sdpa"
        if backend == "te":
            return self.te_attention(q, k, v)  # TE forks the tracker itself for its dropout
        p = self.dropout if self.training else 0.0
        fn = {"flash": self._flash, "sdpa": self._sdpa, "unfused": self._unfused}[backend]
        if p > 0:
            with get_rng_tracker().fork():  # heads differ per TP rank: so must their dropout
                return fn(q, k, v, attn_mask, p)
        return fn(q, k, v, attn_mask, p)

    def _sdpa(self, q, k, v, attn_mask, p):
        s, b, heads, d = q.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # SDPA wants [b, heads, s, d]
        kwargs = dict(attn_mask=attn_mask, is_causal=attn_mask is None, dropout_p=p)
        if k.shape[1] != heads:
            kwargs["enable_gqa"] = True
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        return out.permute(2, 0, 1, 3).reshape(s, b, heads * d)

    def _flash(self, q, k, v, attn_mask, p):
        from flash_attn import flash_attn_func
        s, b, heads, d = q.shape
        out = flash_attn_func(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), dropout_p=p,
                              softmax_scale=self.scale, causal=True)  # [b, s, heads, d]
        return out.transpose(0, 1).reshape(s, b, heads * d)

    def _unfused(self, q, k, v, attn_mask, p):
        s, b, heads, d = q.shape
        sk, groups = k.shape[0], k.shape[2]
        if groups != heads:  # query head i uses key/value group i // (heads / groups), as SDPA's GQA
            k, v = (t.repeat_interleave(heads // groups, dim=2) for t in (k, v))
        # [b * heads, s, d] copies: what the two matmuls keep for backward (Q, K, V)
        q = q.permute(1, 2, 0, 3).reshape(b * heads, s, d)
        kt = k.permute(1, 2, 3, 0).reshape(b * heads, d, sk)
        v = v.permute(1, 2, 0, 3).reshape(b * heads, sk, d)
        scores = torch.bmm(q, kt).view(b, heads, s, sk)
        if attn_mask is None:
            probs = softmax_front.scaled_upper_triang_masked_softmax(scores, self.scale, self.softmax_impl)
        elif attn_mask.dtype == torch.bool:
            # kernels take [b, 1, sq, sk]; a padding mask comes as [b, 1, 1, sk]
            masked = ~attn_mask.expand(attn_mask.shape[0], 1, s, sk)
            probs = softmax_front.scaled_masked_softmax(scores, masked, self.scale, self.softmax_impl)
        else:
            probs = torch.softmax(scores * self.scale + attn_mask, dim=-1)
        if p > 0:
            probs = F.dropout(probs, p, True)
        out = torch.bmm(probs.view(b * heads, s, sk), v)
        return out.view(b, heads, s, d).permute(2, 0, 1, 3).reshape(s, b, heads * d)
