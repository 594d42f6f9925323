"""The MoE line of the start-up log, naming where capacity differs from Megatron-Core."""


def describe(config, tp_size: int, cp_size: int) -> str:
    """One line: experts, top-k, dispatcher, and the capacity rule. With a capacity factor where
    ranks hold parts of a sequence (TP > 1 or CP > 1), it says that drops follow one process's rule
    over the whole micro-batch, where Megatron-Core counts capacity per rank's share of the tokens."""
    c = config
    layers = (f"every {c.moe_layer_freq} layer(s)" if isinstance(c.moe_layer_freq, int)
              else f"layers {''.join(map(str, c.moe_layer_freq))} (1: MoE)")
    groups = (f" from {c.moe_router_group_topk} of {c.moe_router_num_groups} groups" if c.moe_router_group_topk
              else "")
    line = (f"> MoE: {c.num_experts} experts, top-{c.moe_router_topk}{groups}, {layers}, "
            f"{c.moe_token_dispatcher_type} dispatcher, EP {c.expert_model_parallel_size}")
    if c.moe_router_force_load_balancing:
        line += (", forced load balancing (random logits: a fixed random function of each token's direction per "
                 "layer, the same in every layout; differs from Megatron-Core's device-generator draws)")
    if c.moe_expert_capacity_factor is None:
        return line + ", dropless"
    line += (f", capacity factor {c.moe_expert_capacity_factor} (drop by {c.moe_token_drop_policy}"
             + (", padded to capacity" if c.moe_pad_expert_input_to_capacity else "") + ")")
    if tp_size > 1 or cp_size > 1:
        line += ("; capacity and drops are counted over each micro-batch's whole sequence, as one process "
                 "(differs from Megatron-Core, which counts them per rank's share of the tokens)")
    return line
