"""LayerNorm and RMSNorm whose weights are replicated over TP.

With sequence parallelism each TP rank normalises only its sequence shard, so the
weights' gradients are partial: they are marked sequence_parallel (param_meta) and summed
over the TP group in finalize_model_grads. The math is the norm front's
(megatron/core/fusions/norm.py): a fused kernel when one fits, else plain torch.

zero_centered (--apply-layernorm-1p): the weight parameter holds w - 1, initialised to 0, and the norm
scales by 1 + it (Megatron-Core's zero-centred gamma): the same function, with the weight's low-precision
rounding and any decay taken around 1 instead of 0. Checkpoints hold the parameter (w - 1).
"""
import torch
from torch import nn

from ..fusions import norm as norm_front
from ..fusions._common import compiled
from ..tensor_parallel.param_meta import set_init, set_sequence_parallel


def _scale(module):
    """The weight the norm multiplies by: the parameter, or 1 + it when zero-centred."""
    return module.weight + 1 if module.zero_centered else module.weight


class _ResidualNorm:
    """residual_then(x, residual) -> (residual + x, this norm of it); with residual_fusion (--residual-norm-fusion)
    one compiled function where it runs (fusions/norm.residual_fusion_fits), else the add, then forward()."""

    def residual_then(self, x, residual):
        if self.residual_fusion and norm_front.residual_fusion_fits(x, residual, self.weight):
            return self._fused(x, residual)
        s = residual + x
        return s, self(s)


class LayerNorm(_ResidualNorm, nn.Module):
    """[..., h] -> same. fusion=False forces the torch implementation, force="csrc" our kernel."""

    def __init__(self, hidden_size, eps=1e-5, sequence_parallel=False, params_dtype=torch.float32, device=None,
                 fusion=True, force="auto", zero_centered=False, residual_fusion=False):
        super().__init__()
        self.eps, self.zero_centered, self.residual_fusion = eps, zero_centered, residual_fusion
        self.impl = norm_front.select(fusion, device or "cpu", params_dtype, rms=False, force=force)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        self.bias = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        set_init(self.weight, "zeros" if zero_centered else "ones")
        set_init(self.bias, "zeros")
        set_sequence_parallel(self.weight, sequence_parallel)
        set_sequence_parallel(self.bias, sequence_parallel)

    def forward(self, x):
        return norm_front.layer_norm(x, _scale(self), self.bias, self.eps, self.impl)

    def _fused(self, x, residual):
        return compiled(norm_front.residual_layer_norm)(x, residual, _scale(self), self.bias, self.eps)


class RMSNorm(_ResidualNorm, nn.Module):
    """[..., h] -> same: x / sqrt(mean(x^2) + eps) * weight, statistics in fp32."""

    def __init__(self, hidden_size, eps=1e-5, sequence_parallel=False, params_dtype=torch.float32, device=None,
                 fusion=True, force="auto", zero_centered=False, residual_fusion=False):
        super().__init__()
        self.eps, self.zero_centered, self.residual_fusion = eps, zero_centered, residual_fusion
        self.impl = norm_front.select(fusion, device or "cpu", params_dtype, rms=True, force=force)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        set_init(self.weight, "zeros" if zero_centered else "ones")
        set_sequence_parallel(self.weight, sequence_parallel)

    def forward(self, x):
        return norm_front.rms_norm(x, _scale(self), self.eps, self.impl)

    def _fused(self, x, residual):
        return compiled(norm_front.residual_rms_norm)(x, residual, _scale(self), self.eps)


def build_norm(config, device=None):
    cls = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm}[config.normalization]
    return cls(config.hidden_size, config.norm_epsilon, config.sequence_parallel, config.params_dtype, device,
               fusion=config.norm_fusion, force=config.fused_kernels,
               zero_centered=config.layernorm_zero_centered_gamma, residual_fusion=config.residual_norm_fusion)


def build_qk_norm(config, size, device=None, heads_split_over_tp=False):
    """The norm --qk-layernorm adds over `size` features (one head of q or k, or a multi-latent attention
    latent): --normalization's kind and epsilon, as Megatron-Core's q_layernorm / k_layernorm.
    heads_split_over_tp: each TP rank normalises its own heads, so the weight's gradient is partial on every
    rank and is summed over TP (the sequence_parallel rule of param_meta) with or without SP."""
    cls = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm}[config.normalization]
    return cls(size, config.norm_epsilon, heads_split_over_tp or config.sequence_parallel, config.params_dtype,
               device, fusion=config.norm_fusion, force=config.fused_kernels,
               zero_centered=config.layernorm_zero_centered_gamma)
