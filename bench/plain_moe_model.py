"""A plain PyTorch Mixture-of-Experts GPT, as a user would write it, to compare ours against.

GPT-2 blocks without linear biases whose MLP is a top-k MoE: a Linear router, top-k of its logits
with a softmax over the k chosen (Megatron's default routing), then a Python loop over the experts
(each an fc1 -> GeLU -> fc2 pair of Linears) that gathers its tokens by index and index_add_s their
probability-weighted outputs back. The Switch load-balancing loss (coeff x E / (k T^2) x
sum_e (sum_t p_te) n_e over the full softmax p) and the ST-MoE z-loss (coeff x mean logsumexp^2)
of every layer are added to the token loss, each microbatch's divided by the microbatches per step,
as ours does. Tied output layer, learned positions, F.cross_entropy over fp32 logits.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.plain_models import copy_params


class MoE(nn.Module):
    def __init__(self, h, ffn, experts, topk, aux_coeff, z_coeff):
        super().__init__()
        self.topk, self.aux_coeff, self.z_coeff = topk, aux_coeff, z_coeff
        self.router = nn.Linear(h, experts, bias=False)
        self.experts = nn.ModuleList(nn.ModuleDict({"fc1": nn.Linear(h, ffn, bias=False),
                                                    "fc2": nn.Linear(ffn, h, bias=False)}) for _ in range(experts))

    def forward(self, x):
        """x [T, h] -> (out [T, h], router losses of this layer)."""
        T, E = x.shape[0], len(self.experts)
        logits = self.router(x)
        top, idx = logits.topk(self.topk, dim=-1)
        probs = torch.softmax(top.float(), dim=-1).type_as(x)
        flat_idx, flat_probs = idx.view(-1), probs.view(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            pairs = (flat_idx == e).nonzero().squeeze(1)
            rows = pairs // self.topk
            y = expert["fc2"](F.gelu(expert["fc1"](x.index_select(0, rows))))
            out.index_add_(0, rows, y * flat_probs[pairs].unsqueeze(1))
        scores = torch.softmax(logits.float(), dim=-1).type_as(logits)
        counts = torch.bincount(flat_idx, minlength=E).to(scores.dtype)
        aux = self.aux_coeff * E / (self.topk * T * T) * (scores.sum(0) * counts).sum()
        z = self.z_coeff * torch.logsumexp(logits, dim=-1).square().mean()
        return out, aux + z


class MoEBlock(nn.Module):
    def __init__(self, s, eps=1e-5):
        super().__init__()
        h = s.hidden
        self.heads = s.heads
        self.ln_1 = nn.LayerNorm(h, eps=eps)
        self.c_attn = nn.Linear(h, 3 * h, bias=False)
        self.c_proj = nn.Linear(h, h, bias=False)
        self.ln_2 = nn.LayerNorm(h, eps=eps)
        self.moe = MoE(h, s.ffn, s.experts, s.topk, s.aux_loss_coeff, s.z_loss_coeff)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.c_attn(self.ln_1(x)).view(B, T, self.heads, 3, C // self.heads)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        y, aux = self.moe(self.ln_2(x).view(B * T, C))
        return x + y.view(B, T, C), aux


class PlainMoEGPT(nn.Module):
    """shape: bench.pair.Shape (hidden, heads, ffn, layers, seq, vocab, experts, topk, loss coefficients)."""

    def __init__(self, shape, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(shape.vocab, shape.hidden)
        self.wpe = nn.Embedding(shape.seq, shape.hidden)
        self.blocks = nn.ModuleList(MoEBlock(shape, eps) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.hidden, eps=eps)

    def forward(self, idx, targets):
        """-> (mean token loss, the router losses of all layers summed)."""
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        router = 0.0
        for blk in self.blocks:
            x, aux = blk(x)
            router = router + aux
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1)), router


def copy_into_moe(ours, plain):
    m = {"wte.weight": "word_embeddings.weight", "wpe.weight": "position_embeddings",
         "ln_f.weight": "decoder.final_layernorm.weight", "ln_f.bias": "decoder.final_layernorm.bias"}
    for i, blk in enumerate(plain.blocks):
        o = f"decoder.layers.{i}."
        for b, theirs in {"ln_1": "input_layernorm", "ln_2": "pre_mlp_layernorm"}.items():
            for w in ("weight", "bias"):
                m[f"blocks.{i}.{b}.{w}"] = f"{o}{theirs}.{w}"
        m[f"blocks.{i}.c_attn.weight"] = f"{o}self_attention.linear_qkv.weight"
        m[f"blocks.{i}.c_proj.weight"] = f"{o}self_attention.linear_proj.weight"
        m[f"blocks.{i}.moe.router.weight"] = f"{o}mlp.router.weight"
        for e in range(len(blk.moe.experts)):
            for fc in ("fc1", "fc2"):
                m[f"blocks.{i}.moe.experts.{e}.{fc}.weight"] = f"{o}mlp.experts.local_experts.{e}.{fc}_weight"
    copy_params(ours, plain, m)
