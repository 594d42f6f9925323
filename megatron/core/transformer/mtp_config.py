"""Multi-token prediction (DeepSeek-V3) configuration: Megatron-Core's flag names and defaults.

A base of TransformerConfig (config.py); check_mtp() is called by config_checks.validate(); the fields are
read by transformer/mtp.py and models/gpt.
"""
from dataclasses import dataclass

from ..config_fields import flag_namer, opt
from ..errors import ConfigError
from ..ranges import NON_NEGATIVE, check_ranges


@dataclass
class MTPConfig:
    mtp_num_layers: int | None = opt(
        None, "Multi-token prediction: this many sequential modules after the last layer, module k predicting the "
        "token k + 1 ahead (each: norms of the previous hidden state and of the next token's embedding, a "
        "projection, one transformer layer, the shared output head). None: none.")
    mtp_loss_scaling_factor: float = opt(
        0.1, "The MTP losses' weight: each module's loss enters the training loss times this / --mtp-num-layers "
        "(logged unscaled, as 'mtp_1 loss' ...).", requires="mtp_num_layers")


def check_mtp(cfg) -> None:
    """ConfigError for multi-token prediction flags that do not fit (reads cfg only)."""
    if cfg.mtp_num_layers is None:
        return
    f = flag_namer(cfg)
    if cfg.mtp_num_layers < 1:
        raise ConfigError(f"{f('mtp_num_layers')} must be a positive integer, got {cfg.mtp_num_layers}")
    check_ranges(cfg, {"mtp_loss_scaling_factor": NON_NEGATIVE}, f)
    if cfg.position_embedding_type != "rope":
        raise ConfigError(f"{f('mtp_num_layers')} is built for rotary positions only (the learned position table "
                          f"would need shifted positions): give {f('position_embedding_type')} rope")
    if cfg.seq_length <= cfg.mtp_num_layers:
        raise ConfigError(f"{f('mtp_num_layers')} ({cfg.mtp_num_layers}) must be below {f('seq_length')} "
                          f"({cfg.seq_length}): module k predicts k + 1 tokens ahead")
