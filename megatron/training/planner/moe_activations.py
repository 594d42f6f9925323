"""Saved-activation bytes of an MoE layer's feed-forward part, for the memory estimator (planner/activations.py).

Korthikanti et al. 2022 count a dense layer's MLP (16-bit activations, 1-byte dropout mask, ffn 4h) as
    19 s b h without TP, 3 s b h + 16 s b h / t with TP t, 19 s b h / t with TP and SP
(input 2, fc1 output 8, GeLU output 8, dropout mask 1). An MoE layer keeps instead, with T = s b
tokens, E experts, top k, expert ffn f (e = expert TP: --expert-tensor-parallel-size, else t),
activations of `a` bytes (2 for bf16/fp16, 4 for fp32) and P routed pairs on this rank:
    input            a T h        whole tokens for the router and the dispatch (gathered with SP)
    dropout mask     T h          (/ t with SP; a bytes for fp32, as the dense formula doubles it)
    router           4 T E + 12 T k   fp32 scores, int64 top-k indices, fp32 probs of the top k
    each pair        a h (expert input) + MLP(f / e) + 2 a h (expert output, and the same weighed by
                     its prob: combine keeps both) + 16 (two int64 dispatch indices) + a (its prob)
    shared experts   T MLP(fs / t), and with --moe-shared-expert-gate the MLP output a T h (/ t with SP)
                     and the gate a T
where MLP(f) per token is a (f + f) with GeLU (fc1 and GeLU outputs) and a (2 f + f + f) with SwiGLU
(fc1 output [gate; up], silu(gate) and the product).
P = k T: every rank routes k T pairs and EP ranks trade them, each receiving k T when the load is
balanced (more on a rank whose experts are popular); with a capacity factor cf at most cf k T.
At one process, dropless, without z-loss, this is exactly what autograd saves
(tests/unit/test_moe_activation_memory.py measures it).
"""
from ...core.parallel_layout import expert_tensor_parallel


def dense_mlp_bytes(tokens, h, tp=1, sp=False):
    """Korthikanti et al.'s MLP share of one layer, 16-bit: 19 T h split as above."""
    if sp:
        return 19 * tokens * h / tp
    return 3 * tokens * h + 16 * tokens * h / tp


def _ffn_bytes(f, swiglu, act):
    """MLP(f) of the module docstring: bytes per token through one MLP of hidden size f."""
    return act * f * (4 if swiglu else 2)


def moe_mlp_bytes(c, tokens, tp=1, sp=False, act=2):
    """The MoE layer's feed-forward share of saved activations (bytes, this rank) for config c
    (MoEConfig and TransformerConfig fields), `tokens` = s x b tokens of one micro-batch, `act`
    bytes per activation element; the layer's dropout mask included, as in the dense formula."""
    h, E, k = c.hidden_size, c.num_experts, c.moe_router_topk
    e = expert_tensor_parallel(tp, c.expert_tensor_parallel_size)  # the ranks splitting each expert
    rep = tokens * h / (tp if sp else 1)
    pairs = k * tokens
    if c.moe_expert_capacity_factor is not None:
        pairs = min(pairs, c.moe_expert_capacity_factor * k * tokens)
    total = act * tokens * h + rep * act / 2 + 4 * tokens * E + 12 * tokens * k
    total += pairs * (3 * act * h + _ffn_bytes(c.expert_ffn_hidden_size / e, c.swiglu, act) + 16 + act)
    fs = c.moe_shared_expert_intermediate_size or 0
    if fs:
        total += tokens * _ffn_bytes(fs / tp, c.swiglu, act)
        if c.moe_shared_expert_gate:
            total += act * rep + act * tokens
    return total


def moe_layer_fraction(c):
    """The share of the model's layers that are MoE layers (0 for a dense model)."""
    if c.num_experts is None:
        return 0.0
    return sum(c.is_moe_layer(n) for n in range(1, c.num_layers + 1)) / c.num_layers


def moe_extra_bytes_per_layer(c, tokens, tp=1, sp=False, act=2):
    """What MoE layers add to the dense per-layer formula (whose MLP share, dense_mlp_bytes, is
    16-bit and doubled for fp32), averaged over the model's layers; 0 for a dense model."""
    frac = moe_layer_fraction(c)
    if not frac:
        return 0.0
    dense = dense_mlp_bytes(tokens, c.hidden_size, tp, sp) * act / 2
    return frac * (moe_mlp_bytes(c, tokens, tp, sp, act) - dense)
