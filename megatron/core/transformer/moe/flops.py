"""Model FLOPs of MoE layers: what they add to a dense model's count (training/observability/flops.py)."""


def moe_flops_per_token(config, layers=None):
    """Forward FLOPs per token of the MoE layers minus those of the dense MLPs they replace.

    Only the active parameters count: per MoE layer, the router 2 h E, the k chosen experts
    k x 2 h f_moe (x3 with SwiGLU, x2 with GeLU) and the shared experts 2 h f_shared (x3 / x2).
    0 for a dense model. Multi-token prediction's layers count as the last decoder layer's kind.
    layers: count only the first `layers` layers (default: the decoder's and multi-token prediction's).
    """
    if config.num_experts is None:
        return 0
    h, mats = config.hidden_size, 3 if config.swiglu else 2
    if layers is None:
        layers = config.num_layers + (config.mtp_num_layers or 0)
    moe_layers = sum(config.is_moe_layer(n) for n in range(1, layers + 1))
    shared = config.moe_shared_expert_intermediate_size or 0
    moe = 2 * h * config.num_experts + 2 * h * mats * (config.moe_router_topk * config.expert_ffn_hidden_size + shared)
    return moe_layers * (moe - 2 * h * config.ffn_hidden_size * mats)
