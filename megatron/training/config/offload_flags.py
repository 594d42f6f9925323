"""Activation offload with Megatron-Core's names, defaults and meanings (its TransformerConfig fields
cpu_offloading, cpu_offloading_num_layers, cpu_offloading_activations, cpu_offloading_weights), and their
checks. TrainingConfig inherits them.

What implements them: megatron/core/transformer/activation_offload.py (the saved-tensor hooks) and
TransformerBlock.offload_first (which layers); the estimator counts it (planner/offload_cost.py);
docs/offload.md.
"""
from dataclasses import dataclass

from ...core.config import ConfigError, opt
from ...core.transformer.activation_offload import ActivationOffloader, offload_model


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

    def resolve_offload(self) -> None:
        """--cpu-offloading-num-layers above 0 means --cpu-offloading (Megatron-LM's mapping), once."""
        if self.cpu_offloading_num_layers > 0:
            self.cpu_offloading = True


def check_offload(model_cfg, cfg) -> None:
    """ConfigError (one line) for activation-offload values that do not fit the model."""
    n, layers = cfg.cpu_offloading_num_layers, model_cfg.num_layers
    if cfg.cpu_offloading and not 0 <= n < layers:
        raise ConfigError(f"--cpu-offloading-num-layers {n} must be in [0, --num-layers ({layers})): the last "
                          "layer's activations are needed as soon as the backward starts; give fewer layers")
    if cfg.cpu_offloading and not (cfg.cpu_offloading_activations or cfg.cpu_offloading_weights):
        raise ConfigError("--cpu-offloading with --no-cpu-offloading-activations and without "
                          "--cpu-offloading-weights offloads nothing: drop one of them or add --cpu-offloading-weights")


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
