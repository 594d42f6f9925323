"""Feed-forward block: column-parallel up projection, GeLU or SwiGLU, row-parallel down."""
import math

from torch import nn

from ..fusions import activations
from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear


class MLP(nn.Module):
    """[s(/TP with SP), b, h] -> same shape; ffn split over the TP group `tp_group`.

    With SwiGLU, linear_fc1 holds [gate; up] (2 x ffn rows); each block is split over TP
    separately (stride 2) so every rank has matching gate and up rows.
    The activation is the front's (megatron/core/fusions/activations.py): with a fused
    kernel, linear_fc1 skips its bias and the kernel adds it. fp8, cp_group: the linears' (layers.py).
    """

    def __init__(self, config, tp_group, device=None, fp8=None, cp_group=None):
        super().__init__()
        fp8 = {"fp8": fp8, "cp_group": cp_group}
        self.swiglu = config.swiglu
        fused = config.bias_swiglu_fusion if config.swiglu else config.bias_gelu_fusion
        self.activation_impl = activations.select(fused, device or "cpu", config.params_dtype, swiglu=config.swiglu,
                                                  force=config.fused_kernels)
        self.gelu_approximate = "tanh" if config.openai_gelu else "none"
        fc1_out = config.ffn_hidden_size * (2 if config.swiglu else 1)
        self.linear_fc1 = ColumnParallelLinear(
            config.hidden_size, fc1_out, group=tp_group, bias=config.add_bias_linear, init_std=config.init_method_std,
            stride=2 if config.swiglu else 1, sequence_parallel=config.sequence_parallel,
            # torch keeps the bias in the matmul (addmm), as before fusions existed
            skip_bias_add=self.activation_impl != "torch", params_dtype=config.params_dtype, device=device, **fp8)
        self.linear_fc2 = RowParallelLinear(
            config.ffn_hidden_size, config.hidden_size, group=tp_group, bias=config.add_bias_linear,
            init_std=config.init_method_std / math.sqrt(2.0 * config.num_layers),
            sequence_parallel=config.sequence_parallel, params_dtype=config.params_dtype, device=device, **fp8)

    def forward(self, x):
        h, bias = self.linear_fc1(x)  # bias is None unless the activation adds it
        if self.swiglu:
            h = activations.bias_swiglu(h, bias, self.activation_impl)
        else:
            h = activations.bias_gelu(h, bias, self.activation_impl, self.gelu_approximate)
        return self.linear_fc2(h)[0]
