"""Shared experts: the dense MLP every token goes through beside its routed experts, with
Megatron-Core's optional sigmoid gate (--moe-shared-expert-gate, Qwen2-MoE's shared_expert_gate)."""
import torch
from torch import nn

from ...tensor_parallel import wgrad_fusion
from ...tensor_parallel.param_meta import set_init, set_sequence_parallel
from ..mlp import MLP


class SharedExpertMLP(MLP):
    """[s(/TP with SP), b, h] -> same: MLP(x), times sigmoid(x . gate_weight) per token with the gate.

    gate_weight [1, h] is replicated over TP; with sequence parallelism each TP rank gates its own
    tokens, so its gradient is summed over TP like a norm's (param_meta.sequence_parallel).
    """

    def __init__(self, config, tp_group, device=None, fp8=None, cp_group=None):
        super().__init__(config, tp_group, device, fp8, cp_group)
        self.gate_weight = None
        if config.moe_shared_expert_gate:
            self.gate_weight = nn.Parameter(torch.empty(1, config.hidden_size, dtype=config.params_dtype,
                                                        device=device))
            set_init(self.gate_weight, "normal", config.init_method_std)
            set_sequence_parallel(self.gate_weight, config.sequence_parallel)

    def forward(self, x):
        out = super().forward(x)
        gate = self.gate_weight
        return out if gate is None else torch.sigmoid(wgrad_fusion.linear_or_fused(x, gate)) * out
