"""--compile-layers (ours, not Megatron-LM's): each transformer layer under torch.compile, and the
combinations it refuses, in one line each. TrainingConfig inherits the flag; what it does is
megatron/core/transformer/compiled_layers.py (docs/kernels.md, "Compiled layers")."""
from dataclasses import dataclass

from ...core.config import ConfigError, opt


@dataclass
class CompileOptions:
    compile_layers: bool = opt(
        False, "This project's (not in Megatron-LM): run each transformer layer under torch.compile (regional "
        "compile, as torchtitan's; an MoE layer's attention part only, its dispatch and experts eager). Inductor "
        "fuses the element-wise work across op boundaries; our csrc kernels step aside inside the compiled "
        "layers. The first iteration pays the compile time.")


def check_compile(model_cfg, train_cfg, layout) -> None:
    """ConfigError (one line) for what --compile-layers cannot run with; nothing without the flag."""
    if not train_cfg.compile_layers:
        return
    if layout.schedule and layout.schedule.startswith("zb"):
        raise ConfigError(f"--compile-layers with --pipeline-schedule {train_cfg.pipeline_schedule}: a compiled "
                          "layer's backward is one autograd node, which the zero-bubble B/W split cannot divide "
                          "into input and weight gradients; drop one of the two")
    if model_cfg.fp8_format is not None:
        raise ConfigError("--compile-layers with --fp8-format is not built (the FP8 casts' scaling state is "
                          "not traced yet); drop one of the two")
    if train_cfg.ddp_config().shards_params:
        raise ConfigError("--compile-layers with --data-parallel-sharding-strategy optim_grads_params (ZeRO-3) is "
                          "not built (the compiled backward would keep the gathered weights); drop one of the two")
    if train_cfg.overlap_param_gather:
        raise ConfigError("--compile-layers with --overlap-param-gather is not built (its waits are hooks on the "
                          "layers' linear modules, inside the compiled region); drop one of the two")

