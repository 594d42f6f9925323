"""Saved-activation bytes per layer (Korthikanti et al. 2022), after activation recompute: the
activations part of the memory estimate (memory.py)."""
import torch

from ...core.transformer import context_parallel
from ...core.transformer.model_options import recomputes
from . import mla_cost
from .fp8_memory import fp8_delta_bytes
from .moe_activations import moe_extra_bytes_per_layer

UNFUSED_BACKENDS = ("local", "unfused")  # --attention-backend values whose core keeps the s x s scores


def keeps_scores(c) -> bool:
    """The attention core keeps s x s tensors for backward: only the unfused core (Megatron-LM's local, the layer
    Korthikanti et al. count). Every fused one (flash-attn, Transformer Engine, SDPA's flash / memory-efficient /
    cuDNN kernels: what --attention-backend auto runs on a GPU) keeps an fp32 log-sum-exp per query and head."""
    return c.attention_backend in UNFUSED_BACKENDS


def core_bytes(c, micro_batch, tp) -> float:
    """Bytes the attention core keeps beyond Q, K, V for one microbatch (no CP): the unfused core's softmax
    output, dropout mask and output, 5 a s^2 b / t in 16 bits (doubled in fp32); a fused core's log-sum-exp,
    4 a s b / t."""
    s, b, a = c.seq_length, micro_batch, c.num_attention_heads
    if keeps_scores(c):
        return 5 * a * s * s * b / tp * (1 if c.params_dtype != torch.float32 else 2)
    return 4 * a * s * b / tp


def activation_bytes_per_layer(c, micro_batch, tp, sp):
    """Korthikanti et al. eq. 1-3 for 16-bit activations: s b h (34 + 5 a s / h) without TP,
    s b h (10 + 24/t + 5 a s/(h t)) with TP, s b h/t (34 + 5 a s/h) with TP and SP, where the 5 a s / h
    term is the unfused attention core's (core_bytes: a fused core keeps a log-sum-exp instead, as
    tests/activation_memory.py's "sdpa-flash" measures). fp32 activations (no --bf16/--fp16) double the rest.
    With --context-parallel-size C: the same on s / C tokens, with the CP attention's log-sum-exp instead of
    the s x s terms (context_parallel.py).
    MoE layers replace the MLP's share by theirs (moe/activation_memory.py), averaged over the layers;
    multi-latent attention replaces Q, K, V and the projection input by its latents and heads (mla_cost.py);
    per-head q/k norms (--qk-layernorm) add their inputs (qk_norm_bytes); FP8 linears keep FP8 inputs
    (fp8_memory.py)."""
    return _plain_bytes_per_layer(c, micro_batch, tp, sp) + fp8_delta_bytes(c, micro_batch, tp, sp)


def _plain_bytes_per_layer(c, micro_batch, tp, sp):
    per = _standard_bytes_per_layer(c, micro_batch, tp, sp)
    tokens = c.seq_length * micro_batch / c.context_parallel_size
    if c.multi_latent_attention:  # its latents and head sizes instead of standard attention's Q, K, V
        per += mla_cost.delta_bytes(c, tokens, tp, sp) * (1 if c.params_dtype != torch.float32 else 2)
    return per + qk_norm_bytes(c, tokens, tp)


def qk_norm_bytes(c, tokens, tp) -> float:
    """Bytes standard attention's --qk-layernorm adds for `tokens` tokens: a fused norm keeps its input, q's copy
    out of the QKV output (heads x kv-channels; k is a view of that output, which v keeps anyway), and an fp32
    statistic per head of q and of k; / t (this rank's heads). Multi-latent attention's norms: mla_cost.py."""
    if not c.qk_layernorm or c.multi_latent_attention:
        return 0
    n = c.num_attention_heads
    g = c.num_query_groups or n
    return tokens * (c.params_dtype.itemsize * n * c.kv_channels + 4 * (n + g)) / tp


def _standard_bytes_per_layer(c, micro_batch, tp, sp):
    s, b, h, a = c.seq_length, micro_batch, c.hidden_size, c.num_attention_heads
    if c.context_parallel_size > 1:
        return context_parallel.activation_bytes_per_layer(s, b, h, a, tp, sp, c.context_parallel_size,
                                                           2 if c.params_dtype != torch.float32 else 4) \
            + moe_extra_bytes_per_layer(c, s * b / c.context_parallel_size, tp, sp, c.params_dtype.itemsize)
    if tp == 1:
        per = s * b * h * 34
    elif sp:
        per = s * b * h * 34 / tp
    else:
        per = s * b * h * (10 + 24 / tp)
    return per * (1 if c.params_dtype != torch.float32 else 2) + core_bytes(c, b, tp) + moe_extra_bytes_per_layer(
        c, s * b, tp, sp, c.params_dtype.itemsize)


def loss_bytes(c, micro_batch, tp) -> float:
    """Bytes the cross entropy keeps for backward per microbatch, [s/C b, V_padded/t] on the last stage (each
    multi-token prediction module's loss keeps as much): the vocab-parallel one (cross_entropy.py) its fp32
    softmax; --cross-entropy-loss-fusion the logits themselves, in the model's dtype (they take the gradient).
    The per-token vectors beside them (target ids, log-sum-exps) are left out."""
    rows = c.seq_length // c.context_parallel_size * micro_batch
    elt = 4 if not c.cross_entropy_loss_fusion else c.params_dtype.itemsize
    return elt * rows * c.padded_vocab_size / tp


def kept_activation_bytes(c, micro_batch, tp, layers, mtp_layers=0):
    """(bytes kept per microbatch in flight, bytes of the one recomputed chunk being worked on) for
    `layers` layers, after --recompute-granularity: full keeps each chunk's 16-bit input (2 s b h, /t
    with SP) and rebuilds one chunk of layers at a time; selective drops the 5 a s / h t score term (core_attn)
    and the two norm outputs, 2 x 2 s b h (/t with SP; layernorm).
    mtp_layers of the layers are multi-token prediction's, which full recompute (the decoder's) leaves whole."""
    full = activation_bytes_per_layer(c, micro_batch, tp, c.sequence_parallel)
    if c.recompute_granularity == "full" and mtp_layers:
        kept, working = kept_activation_bytes(c, micro_batch, tp, layers - mtp_layers)
        return kept + int(full * mtp_layers), working
    if c.recompute_granularity is None or layers == 0:
        return int(full * layers), 0
    s, b, h = c.seq_length, micro_batch, c.hidden_size
    rep = s * b * h / (tp if c.sequence_parallel else 1) * (2 if c.params_dtype != torch.float32 else 4)
    if c.recompute_granularity == "selective":
        core = core_bytes(c, b, tp)  # what the recomputed core no longer keeps
        if c.context_parallel_size > 1 or not recomputes(c, "core_attn"):  # (the CP attention: its own terms)
            core = 0
        norms = 2 * rep if recomputes(c, "layernorm") else 0  # the two norm outputs, freed once read
        return int((full - core - norms) * layers), 0
    k = min(c.recompute_num_layers or 1, layers)
    if c.recompute_method == "block":  # the first k layers of the stage recomputed, the rest kept
        return int(rep * k + full * (layers - k)), int(full)
    return int(rep * -(-layers // k)), int(full * k)
