"""Multi-latent attention against a float64 reference written out here from DeepSeek-V3's equations
(true interleaved rotary pairs, YaRN frequencies and softmax scale computed from the formulas), with and
without query compression; and the config rules."""
import math

import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.config import TransformerConfig
from megatron.core.config_checks import validate
from megatron.core.errors import ConfigError
from megatron.core.transformer.mla import MultiLatentAttention
from megatron.core.transformer.mla_rope import mla_cos_sin

DT = torch.float64
S, B, H, N = 7, 2, 24, 3
QK, R, V, KV_RANK, Q_RANK = 8, 4, 6, 10, 12


def _config(q_lora_rank, **kw):
    base = dict(num_layers=2, hidden_size=H, num_attention_heads=N, seq_length=S, vocab_size=32,
                multi_latent_attention=True, q_lora_rank=q_lora_rank, kv_lora_rank=KV_RANK, qk_head_dim=QK,
                qk_pos_emb_head_dim=R, v_head_dim=V, qk_layernorm=True, normalization="RMSNorm",
                position_embedding_type="rope", rope_type="yarn", rotary_scaling_factor=40.0, mscale=1.0,
                mscale_all_dim=1.0, yarn_original_max_position_embeddings=4, attention_dropout=0.0,
                params_dtype=DT, attention_backend="unfused", norm_fusion=False, apply_rope_fusion=False,
                masked_softmax_fusion=False)
    return TransformerConfig(**{**base, **kw})


def _module(config):
    m = MultiLatentAttention(config, PlanGroup(1, 0), device="cpu")
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=DT) * (0.3 if p.ndim > 1 else 1.0))
    return m


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _yarn_freqs(c):
    """Peng et al.'s YaRN written from the paper: ramp between the dims whose wavelength completes beta_fast and
    beta_slow rotations in the original context."""
    d, base, L = c.qk_pos_emb_head_dim, c.rotary_base, c.yarn_original_max_position_embeddings
    freqs = [base ** (-2 * i / d) for i in range(d // 2)]

    def dim_of(rotations):  # the dim index whose wavelength 2 pi / f fits L / rotations times
        return d * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(dim_of(c.yarn_beta_fast)), 0), min(math.ceil(dim_of(c.yarn_beta_slow)), d - 1)
    out = []
    for i, f in enumerate(freqs):
        ramp = min(max((i - low) / ((high - low) or 0.001), 0.0), 1.0)  # 0: keep f, 1: f / factor
        out.append(f * (1 - ramp) + f / c.rotary_scaling_factor * ramp)
    return out


def _rotate_pairs(x, positions, freqs, m):
    """x [s, ..., d]: pair (x[2i], x[2i+1]) at position p rotated by p f_i, times m."""
    out = torch.empty_like(x)
    for i, f in enumerate(freqs):
        ang = positions.to(DT) * f
        shape = (-1,) + (1,) * (x.dim() - 2)
        cos, sin = (torch.cos(ang) * m).view(shape), (torch.sin(ang) * m).view(shape)
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i], out[..., 2 * i + 1] = a * cos - b * sin, a * sin + b * cos
    return out


def reference(m, c, x):
    eps = c.norm_epsilon
    if c.q_lora_rank is None:
        q = x @ m.linear_q_proj.weight.T
    else:
        q = _rms(x @ m.linear_q_down_proj.weight.T, m.q_layernorm.weight, eps) @ m.linear_q_up_proj.weight.T
    q = q.view(S, B, N, QK + R)
    ckv = x @ m.linear_kv_down_proj.weight.T
    latent, k_pe = ckv[..., :KV_RANK], ckv[..., KV_RANK:]
    kv = (_rms(latent, m.kv_layernorm.weight, eps) @ m.linear_kv_up_proj.weight.T).view(S, B, N, QK + V)
    pos = torch.arange(S)
    mscale = lambda s, a: 0.1 * a * math.log(s) + 1.0 if s > 1 else 1.0  # noqa: E731
    f = c.rotary_scaling_factor
    conc = mscale(f, c.mscale) / mscale(f, c.mscale_all_dim)
    freqs = _yarn_freqs(c)
    q_pe = _rotate_pairs(q[..., QK:], pos, freqs, conc)
    k_pe = _rotate_pairs(k_pe, pos, freqs, conc)  # [S, B, R], one per token for all heads
    scale = mscale(f, c.mscale_all_dim) ** 2 / math.sqrt(QK + R)
    out = torch.empty(S, B, N, V, dtype=DT)
    for b in range(B):
        for h in range(N):
            scores = (q[:, b, h, :QK] @ kv[:, b, h, :QK].T + q_pe[:, b, h] @ k_pe[:, b].T) * scale
            scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
            out[:, b, h] = torch.softmax(scores, -1) @ kv[:, b, h, QK:]
    return out.reshape(S, B, N * V) @ m.linear_proj.weight.T


def _rope(c):
    return mla_cos_sin(c, S, "cpu", DT)


@pytest.mark.parametrize("q_lora_rank", [Q_RANK, None], ids=["q-compressed", "q-direct"])
@pytest.mark.parametrize("backend", ["unfused", "sdpa"])
def test_matches_the_fp64_reference(q_lora_rank, backend):
    c = _config(q_lora_rank, attention_backend=backend)
    m = _module(c)
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(2), dtype=DT)
    got = m(x, _rope(c))
    torch.testing.assert_close(got, reference(m, c, x), rtol=1e-12, atol=1e-12)


def test_plain_rope_and_v_wider_than_q():
    """--rope-type rope (no YaRN ramp, no concentration, scale 1/sqrt(q head)) and a value head wider than
    the query head (q and k padded instead of v)."""
    global V
    old, V = V, 16
    try:
        c = _config(Q_RANK, rope_type="rope", v_head_dim=16, rotary_scaling_factor=1.0)
        m = _module(c)
        x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(4), dtype=DT)
        torch.testing.assert_close(m(x, _rope(c)), reference(m, c, x), rtol=1e-12, atol=1e-12)
    finally:
        V = old


def test_gradients_flow_to_every_parameter():
    c = _config(Q_RANK)
    m = _module(c)
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(3), dtype=DT, requires_grad=True)
    m(x, _rope(c)).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())
    ref_x = x.detach().clone().requires_grad_(True)
    reference(m, c, ref_x).square().sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("kw,match", [
    (dict(position_embedding_type="learned_absolute"), "give --position-embedding-type rope"),
    (dict(qk_pos_emb_head_dim=3), "must be even"),
    (dict(group_query_attention=True, num_query_groups=1), "drop --group-query-attention"),
    (dict(kv_lora_rank=0), "--kv-lora-rank must be a positive integer")])
def test_bad_mla_settings_are_one_line(kw, match):
    with pytest.raises(ConfigError, match=match):
        validate(_config(Q_RANK, **kw).resolve())


def test_up_projection_recompute_gives_the_same_gradients_bitwise():
    grads = []
    for modules in (None, ["core_attn", "mla_up_proj"]):
        c = _config(Q_RANK, recompute_granularity="selective" if modules else None, recompute_modules=modules)
        m = _module(c).train()
        assert m.recompute_up == bool(modules)
        x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(3), dtype=DT, requires_grad=True)
        m(x, _rope(c)).square().sum().backward()
        grads.append([x.grad] + [p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
