"""--optimizer and its options with Megatron-LM's names, defaults and meanings (SGD's and Muon's; Adam's
--adam-* live beside the other training flags), and their checks. TrainingConfig inherits them.

What each does: megatron/core/optimizer/ (update_rules.py picks the rules; muon.py writes the update
out; docs/muon.md).
"""
from dataclasses import dataclass

from ...core.config import ConfigError, opt
from ...core.optimizer.muon import MATMUL_PRECISIONS, TP_MODES, MuonConfig
from ...core.optimizer.newton_schulz import COEFFICIENTS, SCALE_MODES, coefficient_schedule

BUILT = ("adam", "sgd", "muon")
# Megatron-LM's other --optimizer values: dist_muon its deprecated name of muon with the distributed
# optimizer (taken so, as there); the rest are not built and are refused in one line
NOT_BUILT = ("lion", "soap", "adaptive_muon")


@dataclass
class OptimizerOptions:
    optimizer: str = opt("adam", "Optimizer: adam (AdamW), sgd, or muon (Muon on the 2-D hidden matrices, "
                         "--muon-scalar-optimizer on embeddings, the output layer, norms and biases). dist_muon: "
                         "Megatron-LM's deprecated spelling of --optimizer muon --use-distributed-optimizer.",
                         choices=[*BUILT, "dist_muon", *NOT_BUILT])
    sgd_momentum: float = opt(0.9, "Momentum factor for sgd.", requires=("optimizer", "sgd"))
    muon_momentum: float = opt(0.9, "Momentum factor (an EMA of the gradients) for Muon.",
                               requires=("optimizer", "muon"))
    muon_split_qkv: bool = opt(True, "Orthogonalise a fused QKV weight whole (default: Q, K and V apart, each over "
                               "every query group).", flag="--muon-no-split-qkv", requires=("optimizer", "muon"))
    muon_nesterov: bool = opt(False, "Nesterov-style momentum in Muon's inner SGD.", requires=("optimizer", "muon"))
    muon_scale_mode: str = opt("spectral", "Scale of Muon's orthogonalised update: spectral sqrt(max(m, n)), "
                               "unit_rms_norm sqrt(m / n), shape_scaling sqrt(max(1, m / n)) (m x n the whole "
                               "matrix).", choices=list(SCALE_MODES), requires=("optimizer", "muon"))
    muon_fp32_matmul_prec: str = opt("medium", "Precision of the Newton-Schulz matmuls: low / medium bf16 on a GPU, "
                                     "high fp32 (always fp32 on a CPU).", choices=list(MATMUL_PRECISIONS),
                                     requires=("optimizer", "muon"))
    muon_coefficient_type: str = opt("quintic", "Newton-Schulz coefficients: " + ", ".join(COEFFICIENTS) + ".",
                                     requires=("optimizer", "muon"))
    muon_num_ns_steps: int = opt(5, "Newton-Schulz steps per Muon update.", requires=("optimizer", "muon"))
    muon_tp_mode: str = opt("duplicated", "How a tensor-parallel matrix is orthogonalised: duplicated (gather it, "
                            "whole on every TP rank), distributed (the Gram matrix all-reduced each step), both the "
                            "whole matrix's update at any TP size; blockwise (each shard on its own: the update "
                            "depends on the TP size).", choices=list(TP_MODES), requires=("optimizer", "muon"))
    muon_extra_scale_factor: float = opt(1.0, "Additional factor on Muon's update (0.2 gives about AdamW's RMS).",
                                         requires=("optimizer", "muon"))
    muon_scalar_optimizer: str = opt("adam", "Optimizer of the parameters Muon does not take (embeddings, output "
                                     "layer, norms, biases): adam (lion is not built here).", choices=["adam", "lion"],
                                     requires=("optimizer", "muon"))

    def muon_config(self) -> MuonConfig:
        return MuonConfig(self.muon_momentum, self.muon_nesterov, self.muon_num_ns_steps, self.muon_coefficient_type,
                          self.muon_scale_mode, self.muon_extra_scale_factor, self.muon_split_qkv, self.muon_tp_mode,
                          self.muon_fp32_matmul_prec)

    def resolve_optimizer(self) -> None:
        """--optimizer dist_muon is muon with the distributed optimizer (Megatron-LM's mapping), once."""
        if self.optimizer == "dist_muon":
            self.optimizer, self.use_distributed_optimizer = "muon", True


def check_optimizer(cfg) -> None:
    """ConfigError (one line) for optimizer values that do not fit; nothing for AdamW's defaults."""
    if cfg.optimizer in NOT_BUILT:
        raise ConfigError(f"--optimizer {cfg.optimizer} is not built here: use adam, sgd or muon")
    if cfg.optimizer == "sgd" and not 0.0 <= cfg.sgd_momentum < 1.0:
        raise ConfigError(f"--sgd-momentum must be in [0, 1), got {cfg.sgd_momentum}")
    if cfg.optimizer != "muon":
        return
    if not 0.0 < cfg.muon_extra_scale_factor < float("inf"):
        raise ConfigError(f"--muon-extra-scale-factor must be a positive number, got {cfg.muon_extra_scale_factor}")
    if cfg.muon_scalar_optimizer != "adam":
        raise ConfigError(f"--muon-scalar-optimizer {cfg.muon_scalar_optimizer} is not built here: use adam")
    if cfg.optimizer_cpu_offload:
        raise ConfigError("--optimizer-cpu-offload is not built for --optimizer muon (its Newton-Schulz runs on the "
                          "device, over whole matrices): drop one of the two")
    if cfg.muon_coefficient_type not in COEFFICIENTS:
        raise ConfigError(f"--muon-coefficient-type {cfg.muon_coefficient_type} is unknown: one of "
                          f"{', '.join(COEFFICIENTS)}")
    if cfg.muon_num_ns_steps < 1:
        raise ConfigError(f"--muon-num-ns-steps must be at least 1, got {cfg.muon_num_ns_steps}")
    if not 0.0 <= cfg.muon_momentum < 1.0:
        raise ConfigError(f"--muon-momentum must be in [0, 1), got {cfg.muon_momentum}")
    try:
        coefficient_schedule(cfg.muon_coefficient_type, cfg.muon_num_ns_steps)
    except ValueError as e:
        raise ConfigError(f"--muon-num-ns-steps {cfg.muon_num_ns_steps} with --muon-coefficient-type "
                          f"{cfg.muon_coefficient_type}: {e}") from None


def optimizer_line(cfg) -> str | None:
    """The start-up line naming Muon's settings and what is not Megatron-LM's (None for AdamW and SGD)."""
    if cfg.optimizer != "muon":
        return None
    c = cfg.muon_config()
    line = (f"> optimizer: Muon on the 2-D hidden matrices ({c.coefficient_type} Newton-Schulz x {c.num_ns_steps}, "
            f"{c.scale_mode} scale x {c.extra_scale_factor}, momentum {c.momentum}"
            f"{' Nesterov' if c.nesterov else ''}, QKV {'split' if c.split_qkv else 'whole'}, TP mode {c.tp_mode}), "
            "AdamW on the rest; not Megatron-LM's: learned position tables go to AdamW, the distributed optimizer "
            "keeps the momentum in its slices (docs/muon.md)")
    if c.tp_mode == "blockwise":
        line += "; --muon-tp-mode blockwise: each TP shard orthogonalised on its own, so the update depends on the " \
                "TP size (duplicated and distributed do not)"
    return line
