"""DeepSeek-V3: our GPT with multi-latent attention and MoE; HuggingFace DeepseekV3ForCausalLM. This module
holds the family and its config both ways; deepseek_v3_layers.py the tensor names. Both expert layouts are
read (fused gate_up_proj / down_proj as the model holds them, per expert as transformers 5 writes its files);
the fused one is written.

Names: q_a_proj / q_a_layernorm / q_b_proj (or q_proj without query compression), kv_a_proj_with_mqa /
kv_a_layernorm / kv_b_proj, o_proj are our linear_q_down_proj / q_layernorm / linear_q_up_proj
(linear_q_proj), linear_kv_down_proj / kv_layernorm / linear_kv_up_proj, linear_proj, with the same
per-head layouts ([nope, rope] queries, [nope, v] keys / values); the first first_k_dense_replace layers
are dense (--moe-layer-freq [0]*k + [1]*(L - k)); the router (mlp.gate) is sigmoid, group-limited
(n_group / topk_group), normalised and scaled (routed_scaling_factor), and its e_score_correction_bias is
our expert bias (a buffer: the returned tensors hold it under ...router.expert_bias); the n_shared_experts
shared experts are one of moe_intermediate_size x n_shared_experts without a gate; RoPE is interleaved
(rope_interleave, as Megatron-Core's MLA) and YaRN or plain.

Multi-token prediction modules (--mtp-num-layers D) are written as DeepSeek-V3's files hold them, as layers
L .. L + D - 1 with their enorm / hnorm / eh_proj / shared_head and copies of the embedding and head
(num_nextn_predict_layers D); transformers' DeepseekV3ForCausalLM does not load them (it has no MTP), and
read back where the files hold them.

What one side cannot hold is refused in one line (CheckpointError): transformers sums each group's top-2
scores where we sum the top (topk / group-topk); its latent norms have eps 1e-6 whatever rms_norm_eps is.
"""
from ...checkpointing.hf_checks import TrackedTensors
from ...checkpointing.hf_conversion import ends_from_ours, ends_to_ours
from ...errors import CheckpointError
from .deepseek_v3_layers import layers_to_hf, layers_to_ours
from .family import Family

_LATENT_EPS = 1e-6  # DeepseekV3RMSNorm's default, which the latent norms keep


def _refuse(what):
    raise CheckpointError(f"HF DeepSeek-V3 conversion: {what}")


def _rope_args(c):
    rp = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    theta = rp.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    if float(theta) != int(theta) or rp.get("partial_rotary_factor", 1.0) != 1.0 or not c.rope_interleave:
        _refuse("rope theta must be an integer, the rotary part whole and rope_interleave true")
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind == "default":
        return dict(rotary_base=int(theta), rope_type="rope")
    if kind != "yarn" or rp.get("attention_factor") is not None or rp.get("truncate", True) is not True:
        _refuse(f"RoPE {kind!r} (with attention_factor / truncate false) is not ours: yarn or default")
    orig = rp["original_max_position_embeddings"]
    factor = rp.get("factor") or c.max_position_embeddings / orig
    mscale, all_dim = rp.get("mscale"), rp.get("mscale_all_dim")
    if not all_dim and mscale not in (None, 1, 1.0):
        _refuse("yarn mscale without mscale_all_dim: transformers ignores that mscale, Megatron-Core does not")
    return dict(rotary_base=int(theta), rope_type="yarn", rotary_scaling_factor=float(factor),
                mscale=float(mscale if mscale is not None else 1.0), mscale_all_dim=float(all_dim or 0.0),
                yarn_original_max_position_embeddings=int(orig), yarn_beta_fast=float(rp.get("beta_fast") or 32),
                yarn_beta_slow=float(rp.get("beta_slow") or 1))


def _moe_args(c):
    L_, k = c.num_hidden_layers, c.first_k_dense_replace or 0
    if not c.n_routed_experts or k >= L_:
        return {}
    topk, groups, gk = c.num_experts_per_tok, c.n_group or 1, c.topk_group or 1
    if not c.norm_topk_prob or topk < 2:
        _refuse("norm_topk_prob false or one expert per token: our sigmoid routing normalises top-k >= 2")
    limited = groups > 1 and gk < groups
    if limited and topk // gk != 2:
        _refuse(f"transformers ranks groups by their top-2 scores, Megatron-Core by the top topk / topk_group "
                f"({topk} / {gk}): they differ here")
    args = dict(num_experts=c.n_routed_experts, moe_router_topk=topk, moe_ffn_hidden_size=c.moe_intermediate_size,
                moe_layer_freq=1 if k == 0 else [0] * k + [1] * (L_ - k), moe_router_score_function="sigmoid",
                moe_router_enable_expert_bias=True, moe_router_dtype="fp32", moe_aux_loss_coeff=0.0,
                moe_router_topk_scaling_factor=float(c.routed_scaling_factor),
                moe_router_num_groups=groups if limited else None, moe_router_group_topk=gk if limited else None)
    if c.n_shared_experts:
        args["moe_shared_expert_intermediate_size"] = c.moe_intermediate_size * c.n_shared_experts
    return args


def _args(c):
    if c.hidden_act != "silu" or c.attention_bias or c.num_key_value_heads != c.num_attention_heads:
        _refuse("only SiLU models without attention biases and with one key / value head per query head")
    if c.rms_norm_eps != _LATENT_EPS:
        _refuse(f"rms_norm_eps {c.rms_norm_eps}: the latent norms use 1e-6 in transformers, ours --norm-epsilon")
    return dict(num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                ffn_hidden_size=c.intermediate_size, seq_length=c.max_position_embeddings,
                max_position_embeddings=c.max_position_embeddings, position_embedding_type="rope",
                normalization="RMSNorm", norm_epsilon=c.rms_norm_eps, swiglu=True, add_bias_linear=False,
                untie_embeddings_and_output_weights=not c.tie_word_embeddings, hidden_dropout=0.0,
                attention_dropout=float(c.attention_dropout), vocab_size=c.vocab_size, multi_latent_attention=True,
                q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank, qk_head_dim=c.qk_nope_head_dim,
                qk_pos_emb_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim, qk_layernorm=True,
                **_rope_args(c), **_moe_args(c))


def to_ours(config, sd):
    """DeepseekV3ForCausalLM config and state dict -> (model args, {init_key: tensor}); the expert biases are
    among the tensors, keyed ...mlp.router.expert_bias (the caller stores them as buffers). Multi-token
    prediction modules come along where the files hold them (model.layers.{L + k}, as DeepSeek-V3's do)."""
    a = _args(config)
    sd = TrackedTensors(sd, "the HuggingFace checkpoint")
    out = ends_to_ours(sd, a["untie_embeddings_and_output_weights"])
    moe_from = (config.first_k_dense_replace or 0) if a.get("num_experts") else a["num_layers"]
    layers_to_ours(config, sd, out, a, moe_from)
    sd.refuse_unused(ignore=r"rotary_emb\.")
    return a, {k: v.contiguous() for k, v in out.items()}


def _check_ours(a):
    if not (a.get("multi_latent_attention") and a.get("qk_layernorm") and a.get("swiglu")
            and a.get("normalization") == "RMSNorm" and not a.get("add_bias_linear", True)
            and a.get("position_embedding_type") == "rope" and not a.get("post_norm")):
        _refuse("the model needs --multi-latent-attention --qk-layernorm --swiglu --normalization RMSNorm "
                "--disable-bias-linear and rope")
    if a["norm_epsilon"] != _LATENT_EPS:
        _refuse(f"--norm-epsilon {a['norm_epsilon']}: transformers' latent norms use 1e-6")
    if not a.get("num_experts"):
        return 0
    pattern, n = a.get("moe_layer_freq", 1), a["num_layers"]
    k = pattern.index(1) if isinstance(pattern, list) and 1 in pattern else (0 if pattern == 1 else -1)
    if k < 0 or (isinstance(pattern, list) and pattern != [0] * k + [1] * (n - k)):
        _refuse(f"--moe-layer-freq {pattern}: HF holds dense layers first, then MoE layers only")
    topk, gk = a["moe_router_topk"], a.get("moe_router_group_topk")
    if a.get("moe_router_score_function") != "sigmoid" or topk < 2 or (gk and topk // gk != 2):
        _refuse("HF routes by sigmoid scores, top-k >= 2 normalised, groups ranked by their top-2 scores")
    shared, f = a.get("moe_shared_expert_intermediate_size") or 0, a.get("moe_ffn_hidden_size") or a["ffn_hidden_size"]
    if shared % f or a.get("moe_shared_expert_gate"):
        _refuse("shared experts must be a multiple of --moe-ffn-hidden-size, without a gate")
    return k


def to_hf(a, t, buffers=None):
    """(model args, global tensors, buffers) -> (DeepseekV3Config kwargs, state dict)."""
    k = _check_ours(a)
    t = TrackedTensors(t, "the checkpoint")
    n, E = a["num_layers"], a.get("num_experts") or 0
    f = a.get("moe_ffn_hidden_size") or a["ffn_hidden_size"]
    rope = {"rope_type": "default", "rope_theta": float(a["rotary_base"])}
    if a.get("rope_type", "yarn") == "yarn":
        rope = dict(rope, rope_type="yarn", factor=a["rotary_scaling_factor"], mscale=a["mscale"],
                    mscale_all_dim=a["mscale_all_dim"], beta_fast=a["yarn_beta_fast"], beta_slow=a["yarn_beta_slow"],
                    original_max_position_embeddings=a["yarn_original_max_position_embeddings"])
    gk = a.get("moe_router_group_topk")
    cfg = dict(vocab_size=a["vocab_size"], hidden_size=a["hidden_size"], intermediate_size=a["ffn_hidden_size"],
               moe_intermediate_size=f, num_hidden_layers=n, num_attention_heads=a["num_attention_heads"],
               num_key_value_heads=a["num_attention_heads"], n_routed_experts=E or None,
               n_shared_experts=(a.get("moe_shared_expert_intermediate_size") or 0) // f,
               routed_scaling_factor=a.get("moe_router_topk_scaling_factor") or 1.0,
               kv_lora_rank=a["kv_lora_rank"], q_lora_rank=a.get("q_lora_rank"),
               qk_rope_head_dim=a["qk_pos_emb_head_dim"], v_head_dim=a["v_head_dim"], qk_nope_head_dim=a["qk_head_dim"],
               n_group=a.get("moe_router_num_groups") if gk else 1, topk_group=gk or 1,
               num_experts_per_tok=a.get("moe_router_topk"), first_k_dense_replace=k if E else n, norm_topk_prob=True,
               hidden_act="silu", max_position_embeddings=a["max_position_embeddings"], rms_norm_eps=a["norm_epsilon"],
               tie_word_embeddings=not a["untie_embeddings_and_output_weights"], rope_parameters=rope,
               rope_interleave=True, attention_bias=False, attention_dropout=a["attention_dropout"],
               num_nextn_predict_layers=a.get("mtp_num_layers") or 0)
    sd = ends_from_ours(t, a["untie_embeddings_and_output_weights"])
    layers_to_hf(t, sd, a, k, dict(buffers or {}), cfg["num_nextn_predict_layers"])
    t.refuse_unused()
    return cfg, {k_: v.contiguous() for k_, v in sd.items()}


def files_only(sd, cfg):
    """The multi-token prediction layers (model.layers.{L..L + num_nextn_predict_layers - 1}): DeepSeek-V3's
    files hold them, transformers' model has no place for them."""
    n, depth = cfg.get("num_hidden_layers"), cfg.get("num_nextn_predict_layers") or 0
    prefixes = tuple(f"model.layers.{n + k}." for k in range(depth))
    return [k for k in sd if prefixes and k.startswith(prefixes)]


FAMILY = Family(
    name="deepseek_v3", title="DeepSeek-V3", model_type="GPT", switches={"encoder": False, "attention": "latent"},
    preset={"multi_latent_attention": True, "qk_layernorm": True, "position_embedding_type": "rope",
            "normalization": "RMSNorm", "swiglu": True, "add_bias_linear": False},
    hf_model_type="deepseek_v3", hf_config_class="DeepseekV3Config", hf_model_class="DeepseekV3ForCausalLM",
    hf_required_keys=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                      "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"),
    to_ours=to_ours, to_hf=to_hf, holds_expert_bias=True, hf_files_only=files_only)
