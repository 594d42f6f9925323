"""Model FLOPs per iteration, and the peak FLOP/s that MFU divides by (docs/mfu.md).

Per token and layer, a forward pass does 2 FLOPs per multiply-add of every matrix
product: QKV 2h(h + 2 g d), scores and weighted values 4 s h (full square, as
Megatron-LM counts), output projection 2h^2, MLP 2 h f (x3 with SwiGLU, x2 with GeLU);
the logits add 2 h V per token (V padded; tied or not, the product is the same). Training
is 3x forward (backward costs twice forward); activation recompute is not counted (model
FLOPs, not hardware FLOPs). For a standard GPT (f = 4h, g d = h) this is Korthikanti et
al.'s 72 B L s h^2 (1 + s/6h + V/12hL). Multi-latent attention counts its own projections
(attention_flops_per_token); multi-token prediction adds D more layers, each with its 2h x h
projection and the 2 h V logits (docs/mfu.md).
"""
import re

import torch

from ...core.transformer.moe.flops import moe_flops_per_token


def attention_flops_per_token(config):
    """Forward FLOPs per token of one attention block: projections, the full s x s scores and weighted values.
    Multi-latent attention (n heads, q head dq = qk + rope, v head dv, latents rq / rkv): the query path
    2 h rq + 2 rq n dq (or 2 h n dq without compression), the KV down-projection 2 h (rkv + rope), its
    up-projection 2 rkv n (qk + dv), scores 2 s n dq, values 2 s n dv, output 2 n dv h."""
    c, h = config, config.hidden_size
    if c.multi_latent_attention:
        n, dq, dv = c.num_attention_heads, c.q_head_dim, c.v_head_dim
        query = 2 * h * n * dq if c.q_lora_rank is None else 2 * h * c.q_lora_rank + 2 * c.q_lora_rank * n * dq
        kv = 2 * h * (c.kv_lora_rank + c.qk_pos_emb_head_dim) + 2 * c.kv_lora_rank * n * (c.qk_head_dim + dv)
        return query + kv + core_attention_flops_per_token(c) + 2 * n * dv * h
    kv = c.num_query_groups * c.kv_channels
    q = c.num_attention_heads * c.kv_channels
    return 2 * h * (q + 2 * kv) + core_attention_flops_per_token(c) + 2 * q * h


def core_attention_flops_per_token(config):
    """Forward FLOPs per token of the scores and weighted values (the full s x s square): 4 s n d, or with
    multi-latent attention 2 s n (dq + dv). What selective recompute runs again."""
    c, s = config, config.seq_length
    if c.multi_latent_attention:
        return 2 * s * c.num_attention_heads * (c.q_head_dim + c.v_head_dim)
    return 4 * s * c.num_attention_heads * c.kv_channels


def document_attention_share(document_lengths, seq_length):
    """The share of the full s x s attention square that packed documents keep: sum(L_i^2) / (n s^2) over
    the documents of n samples (document_lengths: every document's length, samples in order, as
    transformer/documents.Documents.lengths). Megatron-LM's count (and num_floating_point_operations)
    keeps the full square; times this share, core_attention_flops_per_token gives what is computed."""
    samples = sum(document_lengths) / seq_length
    return sum(n * n for n in document_lengths) / (samples * seq_length ** 2)


def document_attention_flops_removed(config, document_lengths):
    """Model FLOPs (forward and backward, every layer) of one iteration's attention scores and values that
    document masking removes, for the documents of its samples (document_attention_share); report it beside
    num_floating_point_operations, which counts the full square as Megatron-LM does (docs/packing.md)."""
    tokens = sum(document_lengths)
    share = document_attention_share(document_lengths, config.seq_length)
    return 3 * tokens * config.num_layers * core_attention_flops_per_token(config) * (1 - share)


def _layer_flops_per_token(config):
    return attention_flops_per_token(config) + 2 * config.hidden_size * config.ffn_hidden_size * (
        3 if config.swiglu else 2)


def decoder_forward_flops_per_token(config):
    """Forward FLOPs per token of the decoder's layers (not the logits, not multi-token prediction's
    modules): what full recompute runs again."""
    return config.num_layers * _layer_flops_per_token(config) + moe_flops_per_token(config, config.num_layers)


def num_floating_point_operations(config, batch_size):
    """Model FLOPs of one training iteration over `batch_size` samples of config.seq_length."""
    h, s, L = config.hidden_size, config.seq_length, config.num_layers
    per_layer = _layer_flops_per_token(config)
    logits = 2 * h * config.padded_vocab_size
    depth = config.mtp_num_layers or 0  # each MTP module: a layer, its [embedding; hidden] projection, the logits
    per_token = L * per_layer + logits + depth * (per_layer + 2 * (2 * h) * h + logits)
    per_token += moe_flops_per_token(config)  # MoE layers (MTP's too): active experts instead of the dense MLP
    return 3 * batch_size * s * per_token


# Dense (no 2:4 sparsity) peak TFLOP/s per GPU from the vendors' datasheets, by the math
# the matmuls run in: "fp8", "bf16" (= fp16) and "tf32" on tensor cores, "fp32" without them. A
# missing entry means unknown. Matched against torch.cuda.get_device_name(), first match
# wins (so the more specific names come first). Datasheet peaks are not reachable: large
# bf16 GEMMs measure about 70-80% of them (H100 SXM ~700-790 of 989), so MFU >= 50% is
# very good; we still divide by the datasheet number, as Megatron-LM, PaLM and most papers
# do, so MFUs are comparable across papers.
PEAK_TFLOPS = [
    (r"\bGH200\b", "GH200", {"fp8": 1979, "bf16": 989, "tf32": 495, "fp32": 67}),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", {"fp8": 1513, "bf16": 756, "tf32": 378, "fp32": 51}),
    (r"\bH100\b.*\bNVL\b", "H100 NVL", {"fp8": 1671, "bf16": 835}),
    (r"\bH100\b", "H100 SXM", {"fp8": 1979, "bf16": 989, "tf32": 495, "fp32": 67}),
    (r"\bH800\b", "H800", {"fp8": 1979, "bf16": 989, "tf32": 495, "fp32": 67}),
    (r"\bH200\b", "H200", {"fp8": 1979, "bf16": 989, "tf32": 495, "fp32": 67}),
    (r"\bB200\b", "B200", {"fp8": 4500, "bf16": 2250}),
    (r"\bA100\b", "A100", {"bf16": 312, "tf32": 156, "fp32": 19.5}),
    (r"\bA800\b", "A800", {"bf16": 312, "tf32": 156, "fp32": 19.5}),
    (r"\bL40S\b", "L40S", {"fp8": 733, "bf16": 362, "tf32": 183, "fp32": 91.6}),
    (r"\bL4\b", "L4", {"fp8": 242.5, "bf16": 121, "tf32": 60, "fp32": 30.3}),
    (r"\bMI300X\b", "MI300X", {"fp8": 2615, "bf16": 1307, "tf32": 654, "fp32": 163}),
]


def matmul_precision(params_dtype):
    """The peak-table column for matmuls on tensors of params_dtype."""
    if params_dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def lookup_peak(device_name, precision):
    """(table name, dense peak TFLOP/s) for a device name, or None when unknown."""
    for pattern, name, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return (name, peaks[precision]) if precision in peaks else None
    return None


def peak_tflops_per_gpu(device, params_dtype, fp8=False, fp8_output=False):
    """(description, peak TFLOP/s) of this rank's GPU for MFU, or None (CPU, unknown GPU). fp8: the
    linear layers' GEMMs run in FP8 (--fp8-format): the FP8 peak, as Megatron-LM and NeMo report FP8 MFU,
    though attention's and the output layer's GEMMs stay in params_dtype (the description says so;
    fp8_output: the output layer's run in FP8 too, --fp8-output-layer)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    precision = "fp8" if fp8 else matmul_precision(params_dtype)
    found = lookup_peak(torch.cuda.get_device_name(device), precision)
    if found is None:
        return None
    name, peak = found
    rest = f"; attention{'' if fp8_output else ' and output layer'} in {matmul_precision(params_dtype)}" \
        if fp8 else ""
    return f"{name} {precision} dense peak {peak:g} TFLOP/s (datasheet{rest})", float(peak)
