"""Mixture-of-Experts configuration: Megatron-Core's flag names and defaults.

A base of TransformerConfig (config.py), so the CLI is generated from these fields too.
check_moe() is called by config_checks.validate(); the fields are read by the moe package.
"""
from dataclasses import dataclass

from ...config_fields import flag_namer, opt
from ...errors import ConfigError
from ...parallel_layout import experts_folded, sequence_multiple
from ...ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check_ranges
from .layer_pattern import every_n, moe_freq

# the MoE numbers outside these ranges fail in check_moe (NaN and inf everywhere, ranges.py); a negative loss
# weight or bias step would push the routing away from balance, silently
NUMBER_RULES = {"moe_aux_loss_coeff": NON_NEGATIVE, "moe_z_loss_coeff": NON_NEGATIVE,
                "moe_router_bias_update_rate": NON_NEGATIVE, "moe_expert_capacity_factor": POSITIVE,
                "moe_router_topk_scaling_factor": POSITIVE,
                # 0 would read as "not given" (no group-limited routing) where a count was asked for
                "moe_router_num_groups": AT_LEAST_ONE, "moe_router_group_topk": AT_LEAST_ONE}
# the name each balance loss is logged under when several are combined (Megatron-Core's names)
_BALANCE_NAMES = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss"}


@dataclass
class MoEConfig:
    num_experts: int | None = opt(None, "Number of experts in each MoE layer (None: a dense model).")
    moe_layer_freq: int = opt(
        1, "Every this many layers is an MoE layer, counting from the first (1: all); or Megatron-LM's pattern "
        "expression with one 0 (dense) / 1 (MoE) per layer, e.g. '([0]*3+[1]*58)' (three dense layers first).",
        parse=moe_freq, requires="num_experts")
    moe_ffn_hidden_size: int | None = opt(None, "Hidden size of each expert (default --ffn-hidden-size).",
                                          requires="num_experts")
    moe_shared_expert_intermediate_size: int | None = opt(
        None, "Hidden size of the shared experts, run on every token beside the routed ones (None: none).",
        requires="num_experts")
    moe_shared_expert_gate: bool = opt(
        False, "Scale the shared experts' output by a learned sigmoid gate of each token (Qwen2-MoE).",
        requires="num_experts")
    moe_router_topk: int = opt(2, "Experts each token is routed to.", requires="num_experts")
    moe_router_num_groups: int | None = opt(
        None, "Group-limited routing: the experts split into this many equal groups (in index order; e.g. the EP "
        "size for device-limited, the nodes for node-limited routing).", requires="moe_router_group_topk")
    moe_router_group_topk: int | None = opt(
        None, "Group-limited routing: each token's experts come from this many groups, those whose top-(topk / "
        "group-topk) scores sum highest (None: not group-limited).", requires="num_experts")
    moe_router_topk_scaling_factor: float | None = opt(
        None, "Multiply the routing weights of the chosen experts by this (DeepSeek-V3's routed scaling factor; "
        "None: 1).", requires="num_experts")
    moe_router_score_function: str = opt("softmax", "Router scores.", choices=["softmax", "sigmoid"],
                                         requires="num_experts")
    moe_router_pre_softmax: bool = opt(
        False, "Softmax over all experts before the top-k (default: top-k logits, then softmax over those k); "
        "with sigmoid scores there is no softmax to move and it changes nothing (as Megatron-LM).",
        requires="num_experts")
    moe_router_dtype: str | None = opt(
        None, "Compute the router (its logits, scores, top-k and the weights of the expert outputs) in this "
        "dtype (default: the model's).", choices=["fp32", "fp64"], requires="num_experts")
    moe_router_load_balancing_type: str = opt(
        "aux_loss", "Load balancing: aux_loss (Switch/GShard over the micro-batch), seq_aux_loss (per sequence, "
        "DeepSeek-V2) or none; several add up, each with its own --moe-aux-loss-coeff.",
        choices=["aux_loss", "seq_aux_loss", "none"], nargs="+", requires="num_experts")
    moe_aux_loss_coeff: float = opt(0.0, "Weight of the load-balancing loss (0: not applied); one per "
                                    "--moe-router-load-balancing-type.", nargs="+", requires="num_experts")
    moe_z_loss_coeff: float | None = opt(None, "Weight of the router z-loss (ST-MoE; None: not applied).",
                                         requires="num_experts")
    moe_router_enable_expert_bias: bool = opt(
        False, "Aux-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores for the top-k "
        "choice only, moved towards balance after every step.", requires="num_experts")
    moe_router_bias_update_rate: float = opt(1e-3, "Step of the expert-bias update.", requires="num_experts")
    moe_router_force_load_balancing: bool = opt(
        False, "Benchmark switch: route by random logits (a fixed random function of each token's direction per "
        "layer, the same in every layout; Megatron-Core draws them from a device generator) so that experts get "
        "about equal loads; the router's logits get the gradient straight through.", requires="num_experts")
    moe_token_dispatcher_type: str = opt(
        "allgather", "How tokens reach their experts over the expert-parallel group (Megatron-LM's flex, the "
        "DeepEP / HybridEP dispatcher, is not built here).", choices=["allgather", "alltoall", "flex"],
        requires="num_experts")
    moe_permute_fusion: bool = opt(
        False, "Megatron-LM's fused token permutation (Transformer Engine kernels); the permutation here is the "
        "same exact gather either way: accepted, no effect.")
    moe_per_layer_logging: bool = opt(
        False, "Megatron-LM's per-layer router-loss scalars; the log here has each router loss over all layers: "
        "accepted, no effect.")
    moe_grouped_gemm: bool = opt(False, "Run the local experts as one grouped matmul (torch._grouped_mm where "
                                 "available, else a loop).", requires="num_experts")
    moe_expert_capacity_factor: float | None = opt(
        None, "Tokens each expert takes, as a multiple of its even share (None: dropless).", requires="num_experts")
    moe_token_drop_policy: str = opt("probs", "Which tokens an over-full expert drops: lowest probs, or latest "
                                     "position.", choices=["probs", "position"], requires="num_experts")
    moe_pad_expert_input_to_capacity: bool = opt(
        False, "Pad each expert's input to its capacity (from every EP rank) with zero rows: fixed shapes, same "
        "values.", requires="num_experts")
    expert_model_parallel_size: int = opt(1, "Degree of expert parallelism (carved out of data parallelism).")
    expert_tensor_parallel_size: int | None = opt(
        None, "Tensor parallelism of the experts (default --tensor-model-parallel-size: experts split like the "
        "dense MLP). Other than TP: MoE parallel folding, the TP x CP x DP ranks re-split as expert-TP x EP x "
        "expert-DP, each TP rank routing its own tokens (EP may span TP ranks, expert TP may span DP ranks).",
        requires="num_experts")

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def is_moe_layer(self, layer_number: int) -> bool:
        """layer_number counts from 1 over the whole model; past num_layers (multi-token prediction's layers)
        the last decoder layer's kind, as Megatron-Core."""
        if self.num_experts is None:
            return False
        layer_number = min(layer_number, self.num_layers)
        if isinstance(self.moe_layer_freq, (list, tuple)):
            return bool(self.moe_layer_freq[layer_number - 1])
        return (layer_number - 1) % self.moe_layer_freq == 0

    def resolve_moe(self) -> None:
        """As Megatron-LM: a one-item --moe-router-load-balancing-type / --moe-aux-loss-coeff list is its
        item; a --moe-layer-freq pattern that means every N layers is N (check_moe refuses the others)."""
        for name in ("moe_router_load_balancing_type", "moe_aux_loss_coeff"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)) and len(value) == 1:
                setattr(self, name, value[0])
        if isinstance(self.moe_layer_freq, (list, tuple)):
            self.moe_layer_freq = every_n(self.moe_layer_freq, self.num_layers) or list(self.moe_layer_freq)

    def balance_losses(self) -> list:
        """[(load-balancing type, coefficient, logged name)] of the balance losses applied (coefficient > 0)."""
        types, coeffs = self.moe_router_load_balancing_type, self.moe_aux_loss_coeff
        if not isinstance(types, (list, tuple)):
            return [(types, coeffs, "load_balancing_loss")] if types != "none" and coeffs > 0 else []
        return [(t, c, _BALANCE_NAMES[t]) for t, c in zip(types, coeffs) if t != "none" and c > 0]


def check_moe(cfg) -> None:
    """ConfigError for MoE flags that do not fit together (reads cfg only)."""
    f = flag_namer(cfg)
    ep = cfg.expert_model_parallel_size
    if cfg.num_experts is None:
        if ep > 1:
            raise ConfigError(f"{f('expert_model_parallel_size')} {ep} needs {f('num_experts')}")
        return
    if cfg.num_experts < 1 or ep < 1 or (isinstance(cfg.moe_layer_freq, int) and cfg.moe_layer_freq < 1):
        raise ConfigError(f"{f('num_experts')}, {f('expert_model_parallel_size')} and {f('moe_layer_freq')} "
                          "must be positive")
    check_ranges(cfg, NUMBER_RULES, f)
    check_group_routing(cfg, f)
    if not 1 <= cfg.moe_router_topk <= cfg.num_experts:
        raise ConfigError(f"{f('moe_router_topk')} ({cfg.moe_router_topk}) must be between 1 and "
                          f"{f('num_experts')} ({cfg.num_experts})")
    if cfg.num_experts % ep:
        raise ConfigError(f"{f('num_experts')} ({cfg.num_experts}) is not divisible by "
                          f"{f('expert_model_parallel_size')} ({ep}); each expert-parallel rank needs whole experts")
    multiple = sequence_multiple(cfg.tensor_model_parallel_size, cfg.context_parallel_size)
    if cfg.context_parallel_size > 1 and cfg.seq_length % multiple:  # pad tokens would be routed and counted
        raise ConfigError(f"MoE layers with {f('context_parallel_size')} {cfg.context_parallel_size} need "
                          f"{f('seq_length')} ({cfg.seq_length}) to be a multiple of 2 x CP x TP ({multiple}): "
                          "the router would count the padding tokens; change it")
    etp = cfg.expert_tensor_parallel_size
    if etp is not None and etp < 1:
        raise ConfigError(f"{f('expert_tensor_parallel_size')} ({etp}) must be positive (leave it out: "
                          f"{f('tensor_model_parallel_size')})")
    if experts_folded(cfg.tensor_model_parallel_size, etp):
        check_folding(cfg, f)
    if cfg.moe_pad_expert_input_to_capacity and cfg.moe_expert_capacity_factor is None:
        raise ConfigError(f"{f('moe_pad_expert_input_to_capacity')} needs {f('moe_expert_capacity_factor')}")
    if cfg.moe_shared_expert_gate and not cfg.moe_shared_expert_intermediate_size:
        raise ConfigError(f"{f('moe_shared_expert_gate')} needs {f('moe_shared_expert_intermediate_size')}")
    check_balance_and_pattern(cfg, f)


def check_balance_and_pattern(cfg, f) -> None:
    """The balance-loss lists pair up; a --moe-layer-freq pattern has one entry per layer."""
    types, coeffs = cfg.moe_router_load_balancing_type, cfg.moe_aux_loss_coeff
    if isinstance(types, (list, tuple)) or isinstance(coeffs, (list, tuple)):
        n_types = len(types) if isinstance(types, (list, tuple)) else 1
        n_coeffs = len(coeffs) if isinstance(coeffs, (list, tuple)) else 1
        if n_types != n_coeffs:
            raise ConfigError(f"{f('moe_router_load_balancing_type')} gives {n_types} type(s) but "
                              f"{f('moe_aux_loss_coeff')} {n_coeffs} coefficient(s); give one coefficient per type")
        if len(set(types)) != len(types):
            raise ConfigError(f"{f('moe_router_load_balancing_type')} names a type twice: {' '.join(types)}")
    if cfg.moe_token_dispatcher_type == "flex":
        raise ConfigError(f"{f('moe_token_dispatcher_type')} flex (DeepEP / HybridEP) is not built here; use alltoall")
    if isinstance(cfg.moe_layer_freq, (list, tuple)):
        n = len(cfg.moe_layer_freq)
        if n != cfg.num_layers:
            raise ConfigError(f"{f('moe_layer_freq')} gives {n} layers but {f('num_layers')} is {cfg.num_layers}; "
                              "give one 0 or 1 per layer")


def check_group_routing(cfg, f) -> None:
    """--moe-router-group-topk needs groups that split the experts evenly and leave top-k experts to choose;
    topk below group-topk would sum no score per group (every group ties), so it is refused too."""
    groups, group_topk, k = cfg.moe_router_num_groups, cfg.moe_router_group_topk, cfg.moe_router_topk
    if not group_topk:
        return
    if not groups:
        raise ConfigError(f"{f('moe_router_group_topk')} needs {f('moe_router_num_groups')}")
    if groups < 1 or cfg.num_experts % groups:
        raise ConfigError(f"{f('moe_router_num_groups')} ({groups}) must divide {f('num_experts')} "
                          f"({cfg.num_experts})")
    if not 1 <= group_topk <= groups:
        raise ConfigError(f"{f('moe_router_group_topk')} ({group_topk}) must be between 1 and "
                          f"{f('moe_router_num_groups')} ({groups})")
    per_group = cfg.num_experts // groups
    if not group_topk <= k <= group_topk * per_group:
        raise ConfigError(f"{f('moe_router_topk')} ({k}) must be between {f('moe_router_group_topk')} ({group_topk}) "
                          f"and the experts of the chosen groups ({group_topk * per_group})")


def check_folding(cfg, f) -> None:
    """ConfigError for what MoE parallel folding (expert TP != TP, each TP rank routing its own 1/TP of
    the tokens) does not build."""
    etp, tp = cfg.expert_tensor_parallel_size, cfg.tensor_model_parallel_size
    if cfg.seq_length % (tp * cfg.context_parallel_size):
        raise ConfigError(f"{f('expert_tensor_parallel_size')} {etp} needs {f('seq_length')} ({cfg.seq_length}) to "
                          f"be a multiple of TP x CP ({tp * cfg.context_parallel_size}): each TP rank routes its "
                          "share of the sequence; change it")
    if cfg.expert_ffn_hidden_size % etp:  # above TP the dense sizes' checks do not cover it
        raise ConfigError(f"{f('expert_tensor_parallel_size')} {etp} must divide the experts' hidden size "
                          f"({cfg.expert_ffn_hidden_size}, {f('moe_ffn_hidden_size')}); change one of them")
