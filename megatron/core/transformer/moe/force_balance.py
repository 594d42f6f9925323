"""--moe-router-force-load-balancing (Megatron-Core's benchmark switch): route by random logits instead of
the router's, so that every expert gets about the same load whatever the router has learned.

Megatron-Core draws the random logits from a generator on each device, so a token's experts depend on the
layout. Here a token's logits are sqrt(2) sin(F d P): d its direction, P a fixed standard-normal matrix [h, E]
(drawn once per layer from a seed of its layer number), F = 10. Hidden states share large directions, so d P
alone is correlated over tokens and loads some experts more; its sine at ten times is not (tokens whose
directions differ by more than about 0.1 rad get unrelated logits), every expert is equally likely by symmetry,
and a token's logits are the same in every layout up to rounding times F (with F = 100 the router losses of a
TP2 x EP2 run drift 1.3e-5 from one process's within four iterations; with 10 they agree to 1e-7). A
deliberate difference, named in the start-up log's MoE line. As in Megatron-Core the router's own logits get
the gradient (straight through), and the z-loss reads the router's own logits.
"""
import torch
import torch.nn.functional as F

FREQUENCY = 10.0


def projection(hidden_size, num_experts, layer_number, device=None):
    """The layer's fixed [h, E] matrix (standard normal, from a CPU generator seeded by the layer number)."""
    g = torch.Generator().manual_seed(1_000_003 * layer_number)
    return torch.randn(hidden_size, num_experts, generator=g).to(device)


class _StraightThrough(torch.autograd.Function):
    """Forward: the random logits; backward: their gradient goes to the router's logits unchanged."""

    @staticmethod
    def forward(ctx, logits, random):
        return random

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def random_logits(logits, x, matrix):
    """The router's logits [T, E] replaced by sqrt(2) sin(F x's directions [T, h] times matrix [h, E]), in the
    logits' dtype."""
    random = (2 ** 0.5 * torch.sin(FREQUENCY * (F.normalize(x.float(), dim=-1) @ matrix.float()))).to(logits.dtype)
    return _StraightThrough.apply(logits, random)
