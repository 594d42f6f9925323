"""The experts of one MoE layer held by this rank: an MLP each, split over TP like the dense MLP."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...tensor_parallel import weight_grad, wgrad_fusion
from ...tensor_parallel.param_meta import set_expert_parallel, set_init, set_tensor_parallel


class ExpertMLP(nn.Module):
    """One expert: [n, h] -> [n, h], partial over TP (the caller sums over the TP group).

    linear_fc1 [ffn(x2 with SwiGLU)/TP, h] ([gate; up] blocks split separately, as the dense MLP),
    linear_fc2 [h, ffn/TP]; tp_size 1 (no TP, or expert TP 1): whole, replicated over TP. Biases only
    with tp_size 1 (the config refuses them otherwise).
    """

    def __init__(self, config, tp_size, device=None):
        super().__init__()
        ffn, h = config.expert_ffn_hidden_size, config.hidden_size
        self.swiglu = config.swiglu
        self.approximate = "tanh" if config.openai_gelu else "none"
        rows = ffn * (2 if config.swiglu else 1)
        kw = {"dtype": config.params_dtype, "device": device}
        self.fc1_weight = nn.Parameter(torch.empty(rows // tp_size, h, **kw))
        self.fc2_weight = nn.Parameter(torch.empty(h, ffn // tp_size, **kw))
        set_init(self.fc1_weight, "normal", config.init_method_std)
        set_init(self.fc2_weight, "normal", config.init_method_std / math.sqrt(2.0 * config.num_layers))
        if tp_size > 1:
            set_tensor_parallel(self.fc1_weight, 0, stride=2 if config.swiglu else 1)
            set_tensor_parallel(self.fc2_weight, 1)
        self.fc1_bias = self.fc2_bias = None
        if config.add_bias_linear:
            self.fc1_bias = nn.Parameter(torch.empty(rows // tp_size, **kw))
            self.fc2_bias = nn.Parameter(torch.empty(h, **kw))
            set_init(self.fc1_bias, "zeros")
            set_init(self.fc2_bias, "zeros")
        for p in self.parameters():
            set_expert_parallel(p)

    def activation(self, h):
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(h, approximate=self.approximate)

    def forward(self, x):
        # zero-bubble: weight grads in W; gradient-accumulation fusion: added into DDP's buffer
        linear = weight_grad.linear if weight_grad.split_enabled() else wgrad_fusion.linear_or_fused
        h = self.activation(linear(x, self.fc1_weight, self.fc1_bias))
        return linear(h, self.fc2_weight, self.fc2_bias)


class LocalExperts(nn.Module):
    """Experts first .. first+count-1 of a layer (this expert-parallel rank's share).

    Held in a ModuleDict keyed by the GLOBAL expert index, so parameter names (init keys,
    checkpoints) do not depend on the expert-parallel size.
    """

    def __init__(self, config, first, count, tp_size, device=None):
        super().__init__()
        self.first, self.count = first, count
        self.grouped = config.moe_grouped_gemm
        self.local_experts = nn.ModuleDict(
            {str(first + i): ExpertMLP(config, tp_size, device) for i in range(count)})

    def forward(self, x, counts):
        """x [N, h]: tokens sorted by local expert, counts[i] of them for local expert i (a list of
        ints summing to N) -> [N, h], each row through its expert (TP-partial). No communication."""
        if self.grouped:
            from .grouped_gemm import grouped_experts
            return grouped_experts(list(self.local_experts.values()), x, counts)
        outs = [expert(chunk) for expert, chunk in zip(self.local_experts.values(), x.split(counts))]
        return torch.cat(outs) if outs else x[:0]
