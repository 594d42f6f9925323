"""The start-up log's MoE line names the capacity rule, and its difference from Megatron-Core
exactly where ranks hold parts of a sequence."""
import dataclasses

from megatron.core.transformer.moe.describe import describe


@dataclasses.dataclass
class _Cfg:
    num_experts: int = 8
    moe_router_topk: int = 2
    moe_layer_freq: int = 1
    moe_token_dispatcher_type: str = "alltoall"
    expert_model_parallel_size: int = 2
    moe_expert_capacity_factor: float | None = None
    moe_token_drop_policy: str = "probs"
    moe_pad_expert_input_to_capacity: bool = False
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_force_load_balancing: bool = False


def test_dropless_line():
    assert describe(_Cfg(), 2, 2) == ("> MoE: 8 experts, top-2, every 1 layer(s), alltoall dispatcher, EP 2, "
                                      "dropless")


def test_groups_and_pattern_named():
    line = describe(_Cfg(moe_layer_freq=[0, 1, 1], moe_router_num_groups=4, moe_router_group_topk=2), 1, 1)
    assert line.startswith("> MoE: 8 experts, top-2 from 2 of 4 groups, layers 011 (1: MoE), ")


def test_capacity_named_as_megatron_differs_only_where_tokens_are_split():
    cfg = _Cfg(moe_expert_capacity_factor=1.5, moe_token_drop_policy="position",
               moe_pad_expert_input_to_capacity=True)
    one = describe(cfg, 1, 1)
    assert one.endswith("capacity factor 1.5 (drop by position, padded to capacity)")
    for tp, cp in ((2, 1), (1, 2)):
        assert describe(cfg, tp, cp).startswith(one + "; capacity and drops are counted over each micro-batch's "
                                                "whole sequence, as one process (differs from Megatron-Core")


def test_forced_load_balancing_named_as_a_difference():
    line = describe(_Cfg(moe_router_force_load_balancing=True), 1, 1)
    assert "forced load balancing" in line and "differs from Megatron-Core" in line and line.endswith(", dropless")
