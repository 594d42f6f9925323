"""Megatron-FSDP's flags, mapped onto this project's data-parallel sharding (ZeRO, core/distributed) where
they mean the same; the start-up log says how (describe()).

--use-megatron-fsdp shards what --data-parallel-sharding-strategy names (optim_grads_params: ZeRO-3,
parameters gathered per layer for forward and backward): our DDP buffers do exactly that. Its checkpoint
format, fsdp_dtensor, exists so that any FSDP layout reloads a checkpoint; ours are layout-free, so it
maps onto our one format. --fsdp-double-buffer and --fsdp-manual-registration are NCCL buffer-management
speed switches (no effect here, no_effect_flags.py). Gradient dtypes: main-grads and grad-comm both bf16 is
--grad-reduce-in-bf16; 'auto' is what the precision flags give; fp32 main parameters are ours. Other
mixes are refused in one line.
"""
from dataclasses import dataclass

from ...core.config_fields import opt
from ...core.errors import ConfigError

_DTYPES = ["fp32", "bf16", "fp16", "auto"]


@dataclass
class FSDPOptions:
    use_megatron_fsdp: bool = opt(
        False, "Megatron-FSDP: here the data-parallel sharding of --data-parallel-sharding-strategy "
        "(optim_grads_params is ZeRO-3), which shards the same state the same way.")
    fsdp_double_buffer: bool = opt(False, "Megatron-FSDP's double-buffered communication memory (no effect here).")
    fsdp_manual_registration: bool = opt(
        False, "Megatron-FSDP's manual NCCL user-buffer registration (no effect here).")
    megatron_fsdp_main_params_dtype: str = opt(
        "fp32", "Megatron-FSDP's main (optimizer) parameter dtype: fp32, as here (others are not built).",
        choices=_DTYPES)
    megatron_fsdp_main_grads_dtype: str = opt(
        "auto", "Megatron-FSDP's gradient buffer dtype: auto (what the precision flags give), fp32, or bf16 with "
        "--megatron-fsdp-grad-comm-dtype bf16 or auto (= --grad-reduce-in-bf16).", choices=_DTYPES)
    megatron_fsdp_grad_comm_dtype: str = opt(
        "auto", "Megatron-FSDP's gradient reduce-scatter dtype: auto (the gradient buffer's) or the same as "
        "--megatron-fsdp-main-grads-dtype.", choices=_DTYPES)


def _grad_dtype(cfg):
    """The one gradient dtype the Megatron-FSDP dtype flags ask for, or None for 'auto'."""
    main, comm = cfg.megatron_fsdp_main_grads_dtype, cfg.megatron_fsdp_grad_comm_dtype
    if comm not in ("auto", main) and main != "auto":
        raise ConfigError(f"--megatron-fsdp-main-grads-dtype {main} with --megatron-fsdp-grad-comm-dtype {comm}: "
                          "accumulating and reducing gradients in different dtypes is not built here; give both "
                          "the same")
    wanted = comm if main == "auto" else main
    if wanted == "fp16" or cfg.megatron_fsdp_main_params_dtype != "fp32":
        raise ConfigError("Megatron-FSDP fp16 gradients or non-fp32 main parameters are not built here; use "
                          "--megatron-fsdp-main-params-dtype fp32 and fp32 or bf16 gradients")
    return None if wanted == "auto" else wanted


def resolve_fsdp(cfg) -> None:
    """Map the Megatron-FSDP flags onto the sharding and precision flags, once. Raises ConfigError."""
    if not cfg.use_megatron_fsdp:
        return
    if cfg.data_parallel_sharding_strategy is None:  # Megatron-LM's default strategy
        cfg.data_parallel_sharding_strategy = "optim_grads_params"
    wanted = _grad_dtype(cfg)
    if wanted == "bf16":
        if not cfg.bf16:
            raise ConfigError("bf16 Megatron-FSDP gradients need --bf16")
        cfg.grad_reduce_in_bf16 = True
    elif wanted == "fp32" and cfg.grad_reduce_in_bf16:
        raise ConfigError("--megatron-fsdp-main-grads-dtype fp32 contradicts --grad-reduce-in-bf16; drop one")


def describe(cfg):
    """The start-up line of the mapping, or None without --use-megatron-fsdp."""
    if not cfg.use_megatron_fsdp:
        return None
    grads = "bf16 (--grad-reduce-in-bf16)" if cfg.grad_reduce_in_bf16 else "fp32"
    return (f"> Megatron-FSDP mapped onto this project's data-parallel sharding: --data-parallel-sharding-strategy "
            f"{cfg.data_parallel_sharding_strategy}, gradients kept and reduced in {grads}, fp32 main parameters; "
            "checkpoints in the layout-free format (what --ckpt-format fsdp_dtensor is for)")
