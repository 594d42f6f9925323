"""Offload flags and their checks; TrainingConfig inherits them. docs/offload.md says what each does.

Activation offload with Megatron-Core's names, defaults and meanings (its TransformerConfig fields
cpu_offloading, cpu_offloading_num_layers, cpu_offloading_activations, cpu_offloading_weights):
megatron/core/transformer/activation_offload.py (the saved-tensor hooks) and TransformerBlock.offload_first
(which layers); the estimator counts it (planner/offload_cost.py).
Optimizer state in files (--optimizer-offload-path, ours; beside Megatron-LM's --optimizer-cpu-offload):
megatron/core/optimizer/nvme_offload.py.
"""
from dataclasses import dataclass

from ...core.config import ConfigError, opt
from ...core.optimizer.nvme_offload import FileOffload
from ...core.transformer.activation_offload import ActivationOffloader, offload_model
from .output_paths import check_writable


@dataclass
class OffloadOptions:
    cpu_offloading: bool = opt(False, "Megatron-Core's: offload what the first --cpu-offloading-num-layers layers "
                               "of each model chunk save for backward to (pinned) host memory in the forward; it "
                               "comes back for their backward. With recompute, what recompute keeps is offloaded.")
    cpu_offloading_num_layers: int = opt(0, "Layers per model chunk whose saved activations are offloaded (from the "
                                         "first; 0 to --num-layers - 1); above 0 it turns --cpu-offloading on, as in "
                                         "Megatron-LM.")
    cpu_offloading_activations: bool = opt(True, "With --cpu-offloading, keep the activations on the device (only "
                                           "weights then move, with --cpu-offloading-weights).",
                                           flag="--no-cpu-offloading-activations")
    cpu_offloading_weights: bool = opt(False, "With --cpu-offloading, also offload the weights autograd saves (the "
                                       "model keeps its own copy, so this saves device memory only where a weight "
                                       "is saved as a separate tensor).")
    optimizer_offload_path: str | None = opt(
        None, "This project's (not in Megatron-LM; ZeRO-Infinity's idea): keep the fp32 main values and Adam moments "
        "of this rank's share (all of it, or --optimizer-offload-fraction of it with --optimizer-cpu-offload) in a "
        "file under this folder (fast local NVMe), updated chunk by chunk through a bounded host buffer.")
    optimizer_offload_buffer_mb: float = opt(
        64.0, "This project's: MiB of host memory --optimizer-offload-path's step streams the state through.")

    def resolve_offload(self) -> None:
        """--cpu-offloading-num-layers above 0 means --cpu-offloading (Megatron-LM's mapping), once."""
        if self.cpu_offloading_num_layers > 0:
            self.cpu_offloading = True


def check_offload(model_cfg, cfg) -> None:
    """ConfigError (one line) for activation-offload values that do not fit the model."""
    n, layers = cfg.cpu_offloading_num_layers, model_cfg.num_layers
    if n < 0 or cfg.cpu_offloading and not n < layers:
        raise ConfigError(f"--cpu-offloading-num-layers {n} must be in [0, --num-layers ({layers})): the last "
                          "layer's activations are needed as soon as the backward starts; give fewer layers")
    if cfg.cpu_offloading and not (cfg.cpu_offloading_activations or cfg.cpu_offloading_weights):
        raise ConfigError("--cpu-offloading with --no-cpu-offloading-activations and without "
                          "--cpu-offloading-weights offloads nothing: drop one of them or add --cpu-offloading-weights")


def check_optimizer_offload(cfg) -> None:
    """ConfigError (one line) for --optimizer-offload-path values that do not fit; an unwritable folder fails here."""
    if cfg.optimizer_offload_path is None:
        if cfg.optimizer_offload_buffer_mb != 64.0:
            raise ConfigError("--optimizer-offload-buffer-mb goes with --optimizer-offload-path (without it no state "
                              "is in a file); add the path or drop the buffer size")
        return
    if cfg.optimizer != "adam":
        raise ConfigError(f"--optimizer-offload-path is built for --optimizer adam only, not {cfg.optimizer}: "
                          "drop one of the two")
    if not cfg.optimizer_offload_buffer_mb > 0:
        raise ConfigError(f"--optimizer-offload-buffer-mb must be positive, got {cfg.optimizer_offload_buffer_mb}")
    check_writable(cfg.optimizer_offload_path, "--optimizer-offload-path")


def host_state_fraction(cfg) -> float:
    """The share of this rank's optimizer state off the device: --optimizer-offload-fraction with
    --optimizer-cpu-offload, all of it with only --optimizer-offload-path, none otherwise."""
    if cfg.optimizer_cpu_offload:
        return cfg.optimizer_offload_fraction
    return 1.0 if cfg.optimizer_offload_path else 0.0


def optimizer_file_offload(cfg, rank):
    """The FileOffload of --optimizer-offload-path for this (global) rank, or None."""
    if cfg.optimizer_offload_path is None:
        return None
    return FileOffload(cfg.optimizer_offload_path, rank, int(cfg.optimizer_offload_buffer_mb * 2 ** 20))


def optimizer_offload_line(cfg, optimizer):
    """The start-up line of --optimizer-offload-path (None without it)."""
    if cfg.optimizer_offload_path is None:
        return None
    in_file, buffer = optimizer.file_bytes()
    return (f"> optimizer state in files (--optimizer-offload-path {cfg.optimizer_offload_path}): {in_file:,} bytes "
            f"of rank 0's fp32 main values and Adam moments, updated through a {buffer:,}-byte host buffer (torch's "
            "fused AdamW kernel chunk by chunk; plain reads and writes, so the page cache stays out of this process)")


def activation_offloader(cfg, device):
    """The run's ActivationOffloader, or None without --cpu-offloading (or with 0 layers)."""
    if not cfg.cpu_offloading or cfg.cpu_offloading_num_layers == 0:
        return None
    return ActivationOffloader(device, cfg.cpu_offloading_activations, cfg.cpu_offloading_weights)


def attach_activation_offload(model, cfg, device):
    """Offload the configured layers of this rank's model chunks; -> the start-up line (None without offload)."""
    offloader = activation_offloader(cfg, device)
    if offloader is None:
        return None
    n = offload_model(model, offloader, cfg.cpu_offloading_num_layers)
    return (f"> activation offload (--cpu-offloading): the first {cfg.cpu_offloading_num_layers} layers of each "
            f"model chunk ({n} on rank 0): {offloader.describe()}; reloaded when their backward needs them")
