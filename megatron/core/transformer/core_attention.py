"""CoreAttention: dropout(softmax(q k^T / sqrt(d) + mask)) v on [s, b, heads, d] tensors.

The kernels are the attention fronts in megatron/core/fusions/attention.py; this module
picks one per call. Dropout on attention probabilities draws from the tracker's
model-parallel RNG (heads differ per TP rank); flash-attn and SDPA read the device
generator inside tracker.fork().
"""
import math

import torch
from torch import nn

from ..fusions import attention as attention_front
from ..fusions import document_attention
from ..fusions import softmax as softmax_front
from ..tensor_parallel.random import get_rng_tracker
from .context_parallel import context_parallel_attention
from .documents import Documents


class CoreAttention(nn.Module):
    """q [s, b, heads, d], k / v [sk, b, groups, d] (heads a multiple of groups) -> [s, b, heads * d].

    attn_mask None means causal (sk == s); a Documents (documents.py) causal within each packed
    document (fusions/document_attention.py, no [s, s] mask); otherwise SDPA's convention (bool
    True = attend, or an additive float mask) broadcastable to [b, heads, s, sk]. No parameters. cp_group: the
    context-parallel group when CP > 1 (q, k, v then hold this rank's chunks of the sequence).
    head_dim: d when it is not --kv-channels (multi-latent attention): the scale is 1 / sqrt(d) and
    Transformer Engine's attention (built for --kv-channels) gives way to SDPA.
    """

    def __init__(self, config, tp_group=None, layer_number=1, device=None, cp_group=None, head_dim=None):
        super().__init__()
        dtype = config.params_dtype
        device = torch.device(device or "cpu")
        self.dropout = config.attention_dropout
        self.scale = 1.0 / math.sqrt(head_dim or config.kv_channels)
        self.backend = attention_front.select(config.attention_backend, device, dtype)
        if self.backend == "te" and head_dim not in (None, config.kv_channels):
            self.backend = "sdpa"
        self.softmax_impl = softmax_front.select(config.masked_softmax_fusion, device, dtype, causal=True,
                                                 force=config.fused_kernels)
        self.masked_softmax_impl = softmax_front.select(config.masked_softmax_fusion, device, dtype, causal=False,
                                                        force=config.fused_kernels)
        self.softmax_in_fp32 = config.attention_softmax_in_fp32
        self.documents_impl = document_attention.select(self.backend, device, dtype, self.dropout)
        # --window-size / --softmax-type off-by-one (window_config.py): this layer's window and sink
        self.window, self.sink = config.layer_window(layer_number), config.attention_sink()
        self.te_attention = None
        self.cp_group, self.cp_comm_type = cp_group, config.cp_comm_type
        if self.backend == "te":
            self.te_attention = attention_front.build_te(config, tp_group, layer_number)
            if self.te_attention is None:
                self.backend = "sdpa"

    def describe(self):
        name = attention_front.NAMES[self.backend]
        if self.backend != "unfused":
            return name
        return name + f", softmax={self.softmax_impl}, masked softmax={self.masked_softmax_impl}"

    def forward(self, q, k, v, attn_mask=None):
        if self.cp_group is not None:  # this rank holds two chunks of each sequence (context_parallel.py)
            documents = attn_mask if isinstance(attn_mask, Documents) else None
            if attn_mask is not None and documents is None:
                raise ValueError("context parallelism takes the causal mask or packed documents only")
            return context_parallel_attention(q, k, v, self.cp_group, self.cp_comm_type, self.scale,
                                              documents=documents, window=self.window, sink=self.sink)
        if self.window is not None or self.sink is not None:
            return self._windowed(q, k, v, attn_mask)
        if isinstance(attn_mask, Documents):
            return self._documents(q, k, v, attn_mask)
        backend = self.backend
        if attn_mask is not None and backend in ("flash", "te"):
            backend = "sdpa"
        if backend == "te":
            return self.te_attention(q, k, v)  # TE forks the tracker itself for its dropout
        p = self.dropout if self.training else 0.0
        if p > 0:
            with get_rng_tracker().fork():  # heads differ per TP rank: so must their dropout
                return self._run(backend, q, k, v, attn_mask, p)
        return self._run(backend, q, k, v, attn_mask, p)

    def _windowed(self, q, k, v, attn_mask):
        """Windows and sinks: the whole sample one document unless documents are given."""
        if attn_mask is not None and not isinstance(attn_mask, Documents):
            raise ValueError("a sliding window or attention sink takes the causal mask or packed documents only "
                             "(no KV cache, no explicit mask)")
        documents = attn_mask or Documents(torch.zeros(q.shape[1], q.shape[0], dtype=torch.long, device=q.device))
        p = self.dropout if self.training else 0.0
        if p > 0:
            with get_rng_tracker().fork():
                return document_attention.windowed(q, k, v, documents, p, self.scale, self.window, self.sink)
        return document_attention.windowed(q, k, v, documents, p, self.scale, self.window, self.sink)

    def _documents(self, q, k, v, documents):
        impl = self.documents_impl
        if impl == "dense":
            return self.forward(q, k, v, documents.dense_mask())
        run = document_attention.varlen if impl == "varlen" else document_attention.segmented
        p = self.dropout if self.training else 0.0
        if p > 0:
            with get_rng_tracker().fork():  # heads differ per TP rank: so must their dropout
                return run(q, k, v, documents, p, self.scale)
        return run(q, k, v, documents, p, self.scale)

    def _run(self, backend, q, k, v, attn_mask, p):
        if backend == "flash":
            return attention_front.flash(q, k, v, p, self.scale)
        if backend == "unfused":
            return attention_front.unfused(q, k, v, attn_mask, p, self.scale, self.softmax_impl, self.softmax_in_fp32,
                                           self.masked_softmax_impl)
        if backend == "cudnn":
            return attention_front.sdpa_cudnn(q, k, v, attn_mask, p)
        return attention_front.sdpa(q, k, v, attn_mask, p)
