"""LayerNorm and RMSNorm whose weights are replicated over TP.

With sequence parallelism each TP rank normalises only its sequence shard, so the
weights' gradients are partial: they are marked sequence_parallel (param_meta) and summed
over the TP group in finalize_model_grads. The math is the norm front's
(megatron/core/fusions/norm.py): a fused kernel when one fits, else plain torch.
"""
import torch
from torch import nn

from ..fusions import norm as norm_front
from ..tensor_parallel import weight_grad
from ..tensor_parallel.param_meta import set_init, set_sequence_parallel


class LayerNorm(nn.Module):
    """[..., h] -> same. fusion=False forces the torch implementation, force="csrc" our kernel."""

    def __init__(self, hidden_size, eps=1e-5, sequence_parallel=False, params_dtype=torch.float32, device=None,
                 fusion=True, force="auto"):
        super().__init__()
        self.eps = eps
        self.impl = norm_front.select(fusion, device or "cpu", params_dtype, rms=False, force=force)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        self.bias = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        set_init(self.weight, "ones")
        set_init(self.bias, "zeros")
        set_sequence_parallel(self.weight, sequence_parallel)
        set_sequence_parallel(self.bias, sequence_parallel)

    def forward(self, x):
        if weight_grad.split_enabled():  # zero-bubble schedules: weight gradients in a later W action
            return weight_grad.layer_norm(x, self.weight, self.bias, self.eps)
        return norm_front.layer_norm(x, self.weight, self.bias, self.eps, self.impl)


class RMSNorm(nn.Module):
    """[..., h] -> same: x / sqrt(mean(x^2) + eps) * weight, statistics in fp32."""

    def __init__(self, hidden_size, eps=1e-5, sequence_parallel=False, params_dtype=torch.float32, device=None,
                 fusion=True, force="auto"):
        super().__init__()
        self.eps = eps
        self.impl = norm_front.select(fusion, device or "cpu", params_dtype, rms=True, force=force)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        set_init(self.weight, "ones")
        set_sequence_parallel(self.weight, sequence_parallel)

    def forward(self, x):
        if weight_grad.split_enabled():
            return weight_grad.rms_norm(x, self.weight, self.eps)
        return norm_front.rms_norm(x, self.weight, self.eps, self.impl)


def build_norm(config, device=None):
    cls = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm}[config.normalization]
    return cls(config.hidden_size, config.norm_epsilon, config.sequence_parallel, config.params_dtype, device,
               fusion=config.norm_fusion, force=config.fused_kernels)
