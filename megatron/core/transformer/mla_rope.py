"""The rotary embedding of multi-latent attention: standard or YaRN (DeepSeek-V3), on the
qk_pos_emb_head_dim dimensions of the decoupled query / key, in DeepSeek's interleaved pair order.

YaRN (Peng et al. 2023) as Megatron-Core and HF DeepSeek-V3 compute it: each frequency is a blend of the
original (extrapolated) and the one divided by the scaling factor (interpolated), by a linear ramp over
the dimensions between the correction range's ends; cos / sin are multiplied by the concentration factor
mscale(factor, --mscale) / mscale(factor, --mscale-all-dim); the attention softmax scale by
mscale(factor, --mscale-all-dim)^2 / sqrt(head size).
"""
import math

import torch


def yarn_mscale(factor, mscale=1.0):
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _correction_dim(rotations, dim, base, original):
    return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))


def inv_freq(config, device=None, dtype=torch.float32):
    """[d/2] frequencies of the rotary part (d = qk_pos_emb_head_dim); YaRN-blended with --rope-type yarn."""
    dim, base = config.qk_pos_emb_head_dim, config.rotary_base
    powers = base ** (torch.arange(0, dim, 2, device=device, dtype=dtype) / dim)
    plain = 1.0 / powers
    if config.rope_type != "yarn":
        return plain
    original = config.yarn_original_max_position_embeddings
    low = max(math.floor(_correction_dim(config.yarn_beta_fast, dim, base, original)), 0)
    high = min(math.ceil(_correction_dim(config.yarn_beta_slow, dim, base, original)), dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, device=device, dtype=dtype) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1: the original frequency (fast rotations), 0: interpolated
    return 1.0 / (config.rotary_scaling_factor * powers) * (1 - keep) + plain * keep


def concentration(config) -> float:
    """The factor cos / sin are multiplied by (1 without YaRN)."""
    if config.rope_type != "yarn":
        return 1.0
    f = config.rotary_scaling_factor
    return yarn_mscale(f, config.mscale) / yarn_mscale(f, config.mscale_all_dim)


def softmax_scale(config) -> float:
    """The attention scores' scale: mscale(factor, mscale_all_dim)^2 / sqrt(q head size), as Megatron-Core (the
    mscale term for either rope type: it is 1 where the factor is 1 or --mscale-all-dim 0)."""
    m = yarn_mscale(config.rotary_scaling_factor, config.mscale_all_dim)
    return m * m / math.sqrt(config.q_head_dim)


def mla_cos_sin(config, length, device, dtype):
    """cos, sin [length, 1, 1, d] for positions 0..length-1, times the concentration factor. Computed in fp32 (as
    Megatron-Core and HF), in fp64 for an fp64 model."""
    wide = torch.promote_types(dtype, torch.float32)
    angles = torch.outer(torch.arange(length, device=device, dtype=wide), inv_freq(config, device, wide))
    emb = torch.cat([angles, angles], dim=-1)[:, None, None, :]
    m = concentration(config)
    return (emb.cos() * m).to(dtype), (emb.sin() * m).to(dtype)


def deinterleave(x):
    """[..., d] with pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...]: DeepSeek's interleaved
    rotary pairs in the rotate-half order (queries and keys alike, so their dot products are unchanged)."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
