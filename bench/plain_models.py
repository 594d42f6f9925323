"""Plain single-file PyTorch models, as a user would write them, to compare ours against.

PlainGPT (nanoGPT style): token + learned position embedding, pre-LN blocks with one fused qkv
Linear, F.scaled_dot_product_attention (causal), GeLU MLP, final LN, tied output layer.
PlainLlama (gpt-fast style): RMSNorm (F.rms_norm), one fused qkv Linear [q; k; v] with grouped
K/V heads (SDPA's enable_gqa), rotary embedding (rotate-half), SwiGLU with one fused [gate; up]
Linear, untied output layer, no biases.
Both end in F.cross_entropy over fp32 logits. copy_* gives them our model's weights, so the
first losses of the two must agree: that checks they compute the same function.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class GPTBlock(nn.Module):
    def __init__(self, h, heads, ffn, eps):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(h, eps=eps)
        self.c_attn = nn.Linear(h, 3 * h)          # one fused qkv projection
        self.c_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h, eps=eps)
        self.c_fc = nn.Linear(h, ffn)
        self.mlp_proj = nn.Linear(ffn, h)

    def forward(self, x):
        B, T, C = x.shape
        # qkv rows laid out per head as [q, k, v] (Megatron's order) so our weights copy over
        qkv = self.c_attn(self.ln_1(x)).view(B, T, self.heads, 3, C // self.heads)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))    # [B, nh, T, hd]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class PlainGPT(nn.Module):
    def __init__(self, vocab, seq, h, heads, ffn, layers, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(GPTBlock(h, heads, ffn, eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h, eps=eps)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)        # tied output layer
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, h, heads, groups, ffn, eps):
        super().__init__()
        self.heads, self.groups, self.hd, self.eps = heads, groups, h // heads, eps
        self.attention_norm = nn.Parameter(torch.ones(h))
        self.wqkv = nn.Linear(h, (heads + 2 * groups) * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, h, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(h))
        self.w13 = nn.Linear(h, 2 * ffn, bias=False)     # [gate; up]
        self.w2 = nn.Linear(ffn, h, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        qkv = self.wqkv(F.rms_norm(x, (C,), self.attention_norm, self.eps))
        q, k, v = qkv.split([self.heads * self.hd, self.groups * self.hd, self.groups * self.hd], dim=-1)
        q = q.view(B, T, self.heads, self.hd).transpose(1, 2)
        k = k.view(B, T, self.groups, self.hd).transpose(1, 2)
        v = v.view(B, T, self.groups, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.groups != self.heads)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        gate, up = self.w13(F.rms_norm(x, (C,), self.ffn_norm, self.eps)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class PlainLlama(nn.Module):
    def __init__(self, vocab, seq, h, heads, groups, ffn, layers, eps=1e-5, rope_base=10000):
        super().__init__()
        self.eps = eps
        self.tok_embeddings = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(LlamaBlock(h, heads, groups, ffn, eps) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(h))
        self.output = nn.Linear(h, vocab, bias=False)
        hd = h // heads
        inv_freq = 1.0 / rope_base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(F.rms_norm(x, (x.shape[-1],), self.norm, self.eps))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def copy_params(ours, plain, mapping, transforms=None):
    """plain's parameter b takes ours' mapping[b] (through transforms[b] when given)."""
    transforms = transforms or {}
    src = dict(ours.named_parameters())
    dst = dict(plain.named_parameters())
    assert set(mapping) == set(dst), sorted(set(dst) ^ set(mapping))
    with torch.no_grad():
        for b, o in mapping.items():
            value = transforms.get(b, lambda t: t)(src[o])
            assert dst[b].shape == value.shape, (b, dst[b].shape, o, value.shape)
            dst[b].copy_(value)


def copy_into_gpt(ours, plain):
    m = {"wte.weight": "word_embeddings.weight", "wpe.weight": "position_embeddings",
         "ln_f.weight": "decoder.final_layernorm.weight", "ln_f.bias": "decoder.final_layernorm.bias"}
    per_layer = {"ln_1": "input_layernorm", "c_attn": "self_attention.linear_qkv",
                 "c_proj": "self_attention.linear_proj", "ln_2": "pre_mlp_layernorm",
                 "c_fc": "mlp.linear_fc1", "mlp_proj": "mlp.linear_fc2"}
    for i in range(len(plain.blocks)):
        for b, o in per_layer.items():
            for w in ("weight", "bias"):
                m[f"blocks.{i}.{b}.{w}"] = f"decoder.layers.{i}.{o}.{w}"
    copy_params(ours, plain, m)


def qkv_grouped_to_split(w, heads, groups):
    """Our fused QKV rows, per group [q_1..q_k, k, v] x head_dim, -> [all q; all k; all v]."""
    per = heads // groups
    w = w.view(groups, per + 2, -1, w.shape[-1])
    q, k, v = w[:, :per], w[:, per], w[:, per + 1]
    return torch.cat([q.reshape(-1, w.shape[-1]), k.reshape(-1, w.shape[-1]), v.reshape(-1, w.shape[-1])])


def copy_into_llama(ours, plain):
    m = {"tok_embeddings.weight": "word_embeddings.weight", "norm": "decoder.final_layernorm.weight",
         "output.weight": "output_layer.weight"}
    per_layer = {"attention_norm": "input_layernorm.weight", "wqkv.weight": "self_attention.linear_qkv.weight",
                 "wo.weight": "self_attention.linear_proj.weight", "ffn_norm": "pre_mlp_layernorm.weight",
                 "w13.weight": "mlp.linear_fc1.weight", "w2.weight": "mlp.linear_fc2.weight"}
    transforms = {}
    for i, layer in enumerate(plain.layers):
        for b, o in per_layer.items():
            m[f"layers.{i}.{b}"] = f"decoder.layers.{i}.{o}"
        transforms[f"layers.{i}.wqkv.weight"] = lambda w, L=layer: qkv_grouped_to_split(w, L.heads, L.groups)
    copy_params(ours, plain, m, transforms)


def plain_optimizer(model, lr, wd, betas, eps, impl):
    """torch.optim.AdamW over the model's parameters (decay for matrices only, as ours)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    kw = {} if impl == "default" else {"foreach": impl == "foreach", "fused": True if impl == "fused" else None}
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, **kw)


def plain_step(model, opt, batches, clip, forward=None):
    """nanoGPT's loop: zero_grad, grad accumulation, clip by global norm, step (the learning rate is the
    caller's scheduler's). forward: the (compiled) callable for model's forward (default the model); it
    returns the loss, or (lm loss, router losses) for MoE. -> (mean lm loss, grad norm) as tensors."""
    forward = model if forward is None else forward
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for b in batches:
        out = forward(b["tokens"], b["labels"])
        lm, extra = out if isinstance(out, tuple) else (out, None)
        loss = (lm if extra is None else lm + extra) / len(batches)
        loss.backward()
        total = total + (loss.detach() if extra is None else lm.detach() / len(batches))
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
    opt.step()
    return total, norm
