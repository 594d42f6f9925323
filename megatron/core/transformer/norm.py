"""LayerNorm and RMSNorm whose weights are replicated over TP.

With sequence parallelism each TP rank normalises only its sequence shard, so the
weights' gradients are partial: they carry `sequence_parallel=True` and are summed
over the TP group in finalize_model_grads.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..tensor_parallel.initialization import set_init


class LayerNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5, sequence_parallel=False, params_dtype=torch.float32, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        self.bias = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        set_init(self.weight, "ones")
        set_init(self.bias, "zeros")
        self.weight.sequence_parallel = self.bias.sequence_parallel = sequence_parallel

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5, sequence_parallel=False, params_dtype=torch.float32, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=params_dtype, device=device))
        set_init(self.weight, "ones")
        self.weight.sequence_parallel = sequence_parallel

    def forward(self, x):
        # statistics in fp32 even for bf16 activations
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


def build_norm(config, device=None):
    cls = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm}[config.normalization]
    return cls(config.hidden_size, config.norm_epsilon, config.sequence_parallel, config.params_dtype, device)
