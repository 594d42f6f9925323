"""Model flags of Megatron-LM's recipes beyond the core shape flags (issue 31): Megatron-LM's names,
defaults and meanings. A base of TransformerConfig (config.py), so the CLI is generated from these fields.

resolve_options() fills what they imply (--recompute-activations is selective recompute);
check_options() refuses what does not fit. Which flags change nothing here is listed, with the reason,
by megatron/training/config/no_effect_flags.py.
"""
from dataclasses import dataclass

from ..config_fields import flag_namer, opt
from ..errors import ConfigError

# Megatron-LM's --recompute-modules names -> what this project recomputes for them
RECOMPUTE_MODULES = {
    "core_attn": "the attention core (scores, softmax, dropout, weighted sum)",
    "mlp": "the dense MLP of each non-MoE layer",
    "moe": "the whole MoE layer (router, dispatch, experts, shared experts)",
    "mla_up_proj": "multi-latent attention's query and key / value up-projections with the rotary embedding",
    "layernorm": "the two norms of each layer: their outputs freed once read and rebuilt in the backward pass "
                 "(pre-norm layers)",
}
# a module the model may not have: (the field that builds it, why recomputing it then changes nothing)
RECOMPUTE_NEEDS = {"moe": ("num_experts", "a dense model (no --num-experts) has no MoE layer")}
# Megatron-LM's other names: refused in one line (unbuilt_flags.py).
RECOMPUTE_NOT_BUILT = ("moe_act", "shared_experts", "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")


@dataclass
class ModelOptions:
    layernorm_zero_centered_gamma: bool = opt(
        False, "Store each norm's weight as w - 1 (zero-centred; initialised to 0) and scale by 1 + w, as "
        "Megatron-LM's --apply-layernorm-1p (LayerNorm and RMSNorm). Checkpoints hold w - 1; conversion to "
        "HuggingFace adds the 1 back.", flag="--apply-layernorm-1p")
    recompute_activations: bool = opt(
        False, "Selective recompute of the attention core: the same as --recompute-granularity selective.")
    recompute_modules: list[str] | None = opt(
        None, "With --recompute-granularity selective, what to recompute (default core_attn): "
        + "; ".join(f"{k}: {v}" for k, v in RECOMPUTE_MODULES.items()) + ".", nargs="+")
    init_model_with_meta_device: bool = opt(
        False, "Megatron-LM builds the model on the meta device first (for Megatron-FSDP). Accepted: this "
        "project initialises each rank's shard from its layout-free seed, so the values are the same.")
    add_position_embedding: bool = opt(
        True, "No learned position embedding (deprecated in Megatron-LM: allowed there only with "
        "--position-embedding-type rope, which has none).", flag="--no-position-embedding")
    disable_bf16_reduced_precision_matmul: bool = opt(
        False, "With --bf16, forbid reduced-precision reductions in bf16 GEMMs "
        "(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False), as Megatron-LM.")
    use_flash_attn: bool = opt(
        False, "Megatron-LM's older flash-attention switch, which selects nothing there any more "
        "(--attention-backend picks the kernel); accepted, no effect.")
    export_force_local_attention: bool = opt(
        False, "Megatron-LM's ModelOpt export switch (local instead of Transformer Engine attention when exporting); "
        "it changes no result of training: accepted, no effect.")
    rope_type: str | None = opt(
        None, "Rotary embedding variant: rope (the standard one, what --position-embedding-type rope runs) or "
        "yarn (with --multi-latent-attention, its default as in Megatron-LM; not built for standard attention).",
        choices=["rope", "yarn"])
    calculate_per_token_loss: bool = opt(
        False, "Average each loss over all its tokens in the global batch (every DP rank and microbatch "
        "together). Default, as Megatron-LM: the mean over microbatches of each microbatch's per-token mean.")


def resolve_options(cfg) -> None:
    """Fill what the options imply, once: --recompute-activations is selective recompute, whose
    modules default to the attention core (Megatron-LM's rules)."""
    if cfg.recompute_activations and cfg.recompute_granularity is None:
        cfg.recompute_granularity = "selective"
    if cfg.recompute_granularity == "selective" and cfg.recompute_modules is None:
        cfg.recompute_modules = ["core_attn"]


def recomputes(cfg, module) -> bool:
    """Whether selective recompute covers Megatron-LM's module name `module`."""
    return cfg.recompute_granularity == "selective" and module in (cfg.recompute_modules or ["core_attn"])


def check_options(cfg) -> None:
    """ConfigError for option values that do not fit (reads cfg only)."""
    f = flag_namer(cfg)
    if cfg.recompute_activations and cfg.recompute_granularity not in (None, "selective"):
        raise ConfigError(f"{f('recompute_activations')} is selective recompute; it contradicts "
                          f"{f('recompute_granularity')} {cfg.recompute_granularity}: drop one")
    if cfg.recompute_modules is not None:
        if cfg.recompute_granularity != "selective":
            raise ConfigError(f"{f('recompute_modules')} goes with {f('recompute_granularity')} selective")
        unknown = [m for m in cfg.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown:
            what = "not built here" if unknown[0] in RECOMPUTE_NOT_BUILT else "not a module name"
            raise ConfigError(f"{f('recompute_modules')} {unknown[0]}: {what}; choose from "
                              f"{', '.join(RECOMPUTE_MODULES)}")
    if "mla_up_proj" in (cfg.recompute_modules or ()) and not cfg.multi_latent_attention:
        raise ConfigError(f"{f('recompute_modules')} mla_up_proj recomputes multi-latent attention's up-projections: "
                          f"it needs {f('multi_latent_attention')}")
    if "layernorm" in (cfg.recompute_modules or ()) and cfg.post_norm:
        raise ConfigError(f"{f('recompute_modules')} layernorm frees pre-norm outputs; with post-norm layers the "
                          "norm's output is the residual stream: drop layernorm")
    if not cfg.add_position_embedding and cfg.position_embedding_type != "rope":
        raise ConfigError(f"{f('add_position_embedding')} is deprecated (as in Megatron-LM) except with "
                          f"{f('position_embedding_type')} rope; use --position-embedding-type instead")
