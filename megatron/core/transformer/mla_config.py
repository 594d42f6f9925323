"""Multi-latent attention (DeepSeek-V2 / V3) configuration: Megatron-Core's flag names and defaults.

A base of TransformerConfig (config.py), so the CLI is generated from these fields too. check_mla() is
called by config_checks.validate(); resolve_mla() by TransformerConfig.resolve(); the fields are read by
transformer/mla.py and transformer/mla_rope.py.
"""
from dataclasses import dataclass

from ..config_fields import flag_namer, opt
from ..errors import ConfigError
from ..ranges import NON_NEGATIVE, POSITIVE, check_ranges


@dataclass
class MLAConfig:
    multi_latent_attention: bool = opt(
        False, "Multi-latent attention (DeepSeek-V2 / V3): queries and keys / values from low-rank latents, "
        "a decoupled RoPE key shared by the heads.")
    q_lora_rank: int | None = opt(None, "Rank of the query latent (None: queries projected from the hidden "
                                     "state directly, no query compression).")
    kv_lora_rank: int = opt(32, "Rank of the key / value latent.")
    qk_head_dim: int = opt(128, "Per-head size of the query / key part without position embedding (the head "
                           "size of the scores is this plus --qk-pos-emb-head-dim).")
    qk_pos_emb_head_dim: int = opt(64, "Per-head size of the rotary part of queries and of the shared rotary key.")
    v_head_dim: int = opt(128, "Per-head size of the values.")
    qk_layernorm: bool = opt(
        False, "RMSNorm / LayerNorm (--normalization) on each head of the queries and keys before RoPE (Qwen3; "
        "Megatron-Core's q_layernorm / k_layernorm); with --multi-latent-attention on the query and key / value "
        "latents instead, as DeepSeek-V3 (q_layernorm / kv_layernorm).")
    rotary_scaling_factor: float = opt(1.0, "YaRN: the context extension factor (also scales the softmax by "
                                       "mscale(factor, --mscale-all-dim)^2 in multi-latent attention).")
    mscale: float = opt(1.0, "YaRN: the mscale of the rotary embedding's concentration factor.")
    mscale_all_dim: float = opt(0.0, "YaRN: the mscale of all dimensions (divides the concentration factor; "
                                "scales the attention softmax).")
    yarn_original_max_position_embeddings: int = opt(
        4096, "YaRN: the context length the model was first trained at (the frequency ramp's reference).")
    yarn_beta_fast: float = opt(32.0, "YaRN: rotations above which frequencies are kept (extrapolated).")
    yarn_beta_slow: float = opt(1.0, "YaRN: rotations below which frequencies are interpolated.")

    @property
    def q_head_dim(self) -> int:
        return self.qk_head_dim + self.qk_pos_emb_head_dim

    def resolve_mla(self) -> None:
        """--rope-type left out: yarn under multi-latent attention, as Megatron-LM; rope otherwise."""
        if self.multi_latent_attention and self.rope_type is None:
            self.rope_type = "yarn"


MLA_RULES = {"rotary_scaling_factor": POSITIVE, "mscale": NON_NEGATIVE, "mscale_all_dim": NON_NEGATIVE,
             "yarn_beta_fast": POSITIVE, "yarn_beta_slow": POSITIVE}


def check_mla(cfg) -> None:
    """ConfigError for multi-latent attention flags that do not fit (reads cfg only)."""
    if not cfg.multi_latent_attention:
        return
    f = flag_namer(cfg)
    sizes = ["kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
             "yarn_original_max_position_embeddings"]
    for name in sizes + (["q_lora_rank"] if cfg.q_lora_rank is not None else []):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{f(name)} must be a positive integer, got {getattr(cfg, name)}")
    check_ranges(cfg, MLA_RULES, f)
    if cfg.qk_pos_emb_head_dim % 2:
        raise ConfigError(f"{f('qk_pos_emb_head_dim')} ({cfg.qk_pos_emb_head_dim}) must be even (rotary pairs)")
    if cfg.position_embedding_type != "rope":
        raise ConfigError(f"{f('multi_latent_attention')} rotates its decoupled key: give "
                          f"{f('position_embedding_type')} rope")
    if cfg.group_query_attention:
        raise ConfigError(f"{f('multi_latent_attention')} shares one latent over all heads: drop "
                          f"{f('group_query_attention')}")
