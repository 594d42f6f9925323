"""Megatron-LM's precision-aware optimizer flags (--use-precision-aware-optimizer and the dtypes of the main
gradients, main parameters and Adam's two moments), their one resolution and their checks. TrainingConfig
inherits them; the step itself is megatron/core/optimizer/precision_aware_adam.py (docs/kernels.md).

As in Megatron-LM: the dtypes other than fp32 need the flag; the flag needs Adam and the distributed optimizer
(a ZeRO strategy); bf16 main gradients are gradients kept and reduced in bf16 (--grad-reduce-in-bf16 here),
which --accumulate-allreduce-grads-in-fp32 forbids. fp8 moments (Transformer Engine's scaled uint8) are not
built here.
"""
from dataclasses import dataclass

import torch

from ...core.config import ConfigError, opt

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_FIELDS = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")


@dataclass
class PrecisionOptimizerOptions:
    use_precision_aware_optimizer: bool = opt(
        False, "Keep the main parameters and Adam's moments in the dtypes below and update them in one fused "
        "pass per bucket that also writes the model's parameters (no separate copy back). Needs the "
        "distributed optimizer and --optimizer adam.")
    main_grads_dtype: str = opt("fp32", "Dtype of the main gradients with --use-precision-aware-optimizer (bf16: "
                                "kept and reduced in bf16, as --grad-reduce-in-bf16).", choices=["fp32", "bf16"])
    main_params_dtype: str = opt("fp32", "Dtype of the main parameters with --use-precision-aware-optimizer.",
                                 choices=["fp32", "fp16"])
    exp_avg_dtype: str = opt("fp32", "Dtype Adam's first moment is stored in with --use-precision-aware-optimizer "
                             "(the update computes in fp32); fp8 is not built here.",
                             choices=["fp32", "fp16", "bf16", "fp8"])
    exp_avg_sq_dtype: str = opt("fp32", "Dtype Adam's second moment is stored in with "
                                "--use-precision-aware-optimizer (the update computes in fp32); fp8 is not built "
                                "here.", choices=["fp32", "fp16", "bf16", "fp8"])

    def optimizer_dtypes(self):
        """(main params, exp_avg, exp_avg_sq) torch dtypes of the precision-aware step, or None without it."""
        if not self.use_precision_aware_optimizer:
            return None
        return tuple(DTYPES[getattr(self, f)] for f in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"))

    def resolve_main_grads(self) -> None:
        """bf16 main gradients are bf16 gradient buffers (--grad-reduce-in-bf16), once."""
        if self.use_precision_aware_optimizer and self.main_grads_dtype == "bf16" and self.bf16:
            self.grad_reduce_in_bf16 = True


def check_precision_optimizer(cfg) -> None:
    """ConfigError (one line) for precision-aware optimizer flags that do not fit; nothing for the defaults."""
    if not cfg.use_precision_aware_optimizer:
        for field in _FIELDS:
            if getattr(cfg, field) != "fp32":
                flag = "--" + field.replace("_", "-")
                raise ConfigError(f"{flag} {getattr(cfg, field)} needs --use-precision-aware-optimizer (without it "
                                  "every optimizer tensor is fp32, as in Megatron-LM); add it or drop the flag")
        return
    if cfg.optimizer != "adam":
        raise ConfigError(f"--use-precision-aware-optimizer is built for --optimizer adam only, not "
                          f"{cfg.optimizer}; drop one of the two")
    if not cfg.ddp_config().shards_optimizer:
        raise ConfigError("--use-precision-aware-optimizer needs the distributed optimizer (as in Megatron-LM): add "
                          "--use-distributed-optimizer")
    for field in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(cfg, field) == "fp8":
            raise ConfigError(f"--{field.replace('_', '-')} fp8 is not built here (Transformer Engine's scaled uint8 "
                              "moments): use fp32, fp16 or bf16")
    if cfg.optimizer_cpu_offload:
        raise ConfigError("--optimizer-cpu-offload with --use-precision-aware-optimizer is not built (the host step "
                          "is torch's fp32 AdamW, the fused step writes the device's parameters); drop one of the two")
    if cfg.main_grads_dtype == "bf16":
        if not cfg.bf16:
            raise ConfigError("--main-grads-dtype bf16 needs --bf16 (bf16 gradients of an fp32 or fp16 model, with "
                              "fp16's loss scaling, are not built); use --main-grads-dtype fp32")
        if cfg.accumulate_allreduce_grads_in_fp32:
            raise ConfigError("--main-grads-dtype can only be fp32 with --accumulate-allreduce-grads-in-fp32 (as in "
                              "Megatron-LM); drop one of the two")


def precision_optimizer_line(cfg, device) -> str | None:
    """The start-up line naming the precision-aware step's dtypes and implementation (None without it)."""
    if not cfg.use_precision_aware_optimizer:
        return None
    from ...core.fusions._common import csrc_unavailable
    why = csrc_unavailable(device, torch.float32)
    impl = "the csrc fused multi-tensor AdamW" if why is None else f"the Python reference step ({why})"
    return (f"> precision-aware optimizer: main grads {cfg.main_grads_dtype}, main params {cfg.main_params_dtype}, "
            f"exp_avg {cfg.exp_avg_dtype}, exp_avg_sq {cfg.exp_avg_sq_dtype}; {impl}, one step per bucket and "
            "param group, writing the model's parameters (no copy back)")
