"""Rotary position embedding (rotate-half convention, as Megatron-LM and HF Llama)."""
import torch


def rope_cos_sin(seq_len, dim, base, device, dtype=torch.float32):
    """cos, sin of shape [s, 1, 1, dim] for positions 0..seq_len-1."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)[:, None, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x [s, b, heads, d]; cos/sin [s, 1, 1, r] with r <= d: the first r dimensions of each head are
    rotated, the other d - r pass through (partial rotary, --rotary-percent)."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin
