"""Saved-activation bytes of a transformer layer: measured, and as Korthikanti et al. count them.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
per layer, 16-bit activations, 1-byte dropout masks, a heads, TP size t:
    no recompute, TP only:   s b h (10 + 24/t + 5 a s / (h t))
    no recompute, TP + SP:   s b h (34/t + 5 a s / (h t))
    selective recompute:     the same without the 5 a s / (h t) term
    full recompute:          2 s b h (the layer input; / t with SP)
`ours()` itemises the same sum for our layer, with the places where our layer or the
platform keeps something else as explicit parameters (see docs/activation_memory.md):
  mask_bytes   CUDA's fused dropout keeps a bool mask (1 byte); on CPU F.dropout keeps the
               scaled noise tensor in the activation dtype (2 bytes for bf16).
  stat_bytes   LayerNorm keeps mean and rstd per token: fp32 on CUDA (4), the input dtype
               on CPU (2); the paper ignores them.
  core         what the attention core keeps (only without recompute):
    "unfused"      Q, K, V, softmax output, dropout mask, dropout output: the paper's layer.
    "sdpa-flash"   SDPA's flash / memory-efficient kernels (CUDA; CPU without dropout):
                   Q, K, V (views of the QKV output) and an fp32 log-sum-exp [b, a, s]; no
                   s x s tensor. The output it keeps is the same storage as linear_proj's
                   input (allocated in the query's [s, b, a, d] layout): no extra bytes.
    "sdpa-math"    CPU SDPA with dropout falls back to the math path, which upcasts bf16
                   to fp32: Q, K, V, softmax output, dropout noise and dropout output in fp32.
"""
import torch


def measure(fn, exclude=()):
    """(result of fn(), bytes of distinct storages autograd saved for backward during fn()).

    Storages are counted once however many saved tensors view them; `exclude` are tensors
    whose storages are not activations (the parameters).
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen.setdefault(st.data_ptr(), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def korthikanti(s, b, h, a, t=1, sp=False, recompute=None):
    """The paper's bytes per layer (Table 2 / Section 5)."""
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    attn = 0 if recompute == "selective" else 5 * a * s / (h * t)
    return s * b * h * ((34 / t if sp else 10 + 24 / t) + attn)


def ours(s, b, h, a, t=1, sp=False, recompute=None, core="unfused", mask_bytes=1, stat_bytes=0, act=2, ffn=None):
    """Bytes per layer our layer keeps, itemised as the paper does (ffn defaults to 4h)."""
    rep = s * b * h / (t if sp else 1)  # elements of an activation outside the TP regions
    split = s * b * h / t               # ... inside them (this rank's heads)
    att = a * s * s * b / t             # one s x s tensor over this rank's heads
    if recompute == "full":
        return act * rep
    f = (ffn or 4 * h) / h
    total = (act * 4 * rep                  # inputs of the 2 norms, of linear_qkv and linear_fc1
             + 2 * mask_bytes * rep         # 2 hidden-dropout masks
             + 2 * 2 * stat_bytes * rep / h  # 2 norms x (mean, rstd) per token
             + act * split                  # linear_proj input
             + act * 2 * f * split          # GeLU input, linear_fc2 input
             + act * 3 * split)             # Q, K, V (what selective recompute keeps)
    if recompute == "selective":
        return total
    if core == "unfused":
        return total + (2 * act + mask_bytes) * att
    if core == "sdpa-flash":
        return total + 4 * (a / t) * s * b
    if core == "sdpa-math":
        return total - act * 3 * split + 4 * 3 * split + 3 * 4 * att
    raise ValueError(core)


def cpu_latent_norm_extra(c, act):
    """Bytes per token multi-latent attention's latent norms (--qk-layernorm, RMSNorm) keep on CPU beyond
    planner/mla_cost.py's count of their input view and output (what a fused norm kernel keeps): torch's
    RMSNorm keeps its fp32 rstd, the normalised tensor before the weight (act r) and, for bf16, an fp32
    copy of the input (4 r) in place of the bf16 view of the down-projection's output."""
    if not c.qk_layernorm:
        return 0
    out = 0
    for r, width in ((c.q_lora_rank, c.q_lora_rank), (c.kv_lora_rank, c.kv_lora_rank + c.qk_pos_emb_head_dim)):
        if r is None:
            continue
        out += 4 + act * r + (4 * r - act * width if act == 2 else 0)
    return out


def cpu_qk_norm_extra(c, act):
    """Bytes per token standard attention's per-head q/k norms (--qk-layernorm, RMSNorm) keep on CPU beyond
    planner/activations.qk_norm_bytes (what a fused norm keeps): torch's RMSNorm also keeps the normalised q and
    k before the weight (act (n + g) d) and, for bf16, fp32 copies of its inputs (4 (n + g) d) in place of the
    bf16 copy of q (act n d)."""
    n, g, d = c.num_attention_heads, c.num_query_groups or c.num_attention_heads, c.kv_channels
    return act * (n + g) * d + ((4 * (n + g) - act * n) * d if act == 2 else 0)
