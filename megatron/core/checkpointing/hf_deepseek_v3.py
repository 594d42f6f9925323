"""HuggingFace DeepSeek-V3 (DeepseekV3ForCausalLM) <-> our GPT with multi-latent attention and MoE.
Both expert layouts are read (fused gate_up_proj / down_proj as the model holds them, per expert as
transformers 5 writes its files); the fused one is written.

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
import torch

from .hf_checks import TrackedTensors, same_as_tied
from .hf_conversion import L, ends_to_ours
from .pieces import CheckpointError

_Q_LORA = (("q_a_proj", "linear_q_down_proj"), ("q_a_layernorm", "q_layernorm"), ("q_b_proj", "linear_q_up_proj"))
_Q_DIRECT = (("q_proj", "linear_q_proj"),)
_KV_O = (("kv_a_proj_with_mqa", "linear_kv_down_proj"), ("kv_a_layernorm", "kv_layernorm"),
         ("kv_b_proj", "linear_kv_up_proj"), ("o_proj", "linear_proj"))


def _attention_names(q_lora_rank):
    """(HF name, our name) of one layer's attention weights."""
    return (_Q_DIRECT if q_lora_rank is None else _Q_LORA) + _KV_O
_LATENT_EPS = 1e-6  # DeepseekV3RMSNorm's default, which the latent norms keep
_EXPERT = "mlp.experts.local_experts.{}."
_MTP_LAYER = "mtp.layers.{}."
# a multi-token prediction module's own weights (HF under model.layers.{L + k}., ours under mtp.layers.{k}.);
# its embed_tokens and shared_head.head are the model's (ours shares them)
_MTP_NAMES = (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"), ("eh_proj.weight", "eh_proj.weight"),
              ("shared_head.norm.weight", "final_layernorm.weight"))


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


def deepseek_v3_to_ours(config, sd):
    """DeepseekV3ForCausalLM config and state dict -> (model args, {init_key: tensor}); the expert biases are
    among the tensors, keyed ...mlp.router.expert_bias (the caller stores them as buffers). Multi-token
    prediction modules come along where the files hold them (model.layers.{L + k}, as DeepSeek-V3's do)."""
    a = _args(config)
    sd = TrackedTensors(sd, "the HuggingFace checkpoint")
    out = ends_to_ours(sd, a["untie_embeddings_and_output_weights"])
    moe_from = (config.first_k_dense_replace or 0) if a.get("num_experts") else a["num_layers"]
    for i in range(a["num_layers"]):
        _layer_to_ours(sd, out, f"model.layers.{i}.", L.format(i), a, i >= moe_from)
    depth = _mtp_depth(config, sd, a["num_layers"])
    if depth:
        a["mtp_num_layers"] = depth
    for k in range(depth):
        s, o = f"model.layers.{a['num_layers'] + k}.", _MTP_LAYER.format(k)
        _layer_to_ours(sd, out, s, o + "transformer_layer.", a, a["num_layers"] + k >= moe_from)
        for hf, ours in _MTP_NAMES:
            out[o + ours] = sd[s + hf]
        for copy, main in ((s + "embed_tokens.weight", "model.embed_tokens.weight"),
                           (s + "shared_head.head.weight", "lm_head.weight" if "lm_head.weight" in sd
                            else "model.embed_tokens.weight")):
            same_as_tied(sd, copy, main, "and our multi-token prediction shares the model's embedding and head")
    sd.refuse_unused(ignore=r"rotary_emb\.")
    return a, {k: v.contiguous() for k, v in out.items()}


def _mtp_depth(config, sd, n):
    """How many multi-token prediction modules the files hold: num_nextn_predict_layers where model.layers.{n}..
    are there (DeepSeek-V3's files), 0 where none is (transformers writes none: its model has no MTP)."""
    depth = getattr(config, "num_nextn_predict_layers", 0) or 0
    held = [f"model.layers.{n + k}.eh_proj.weight" in sd for k in range(depth)]
    if any(held) and not all(held):
        _refuse(f"config.json names {depth} multi-token prediction layers; the files hold {sum(held)}")
    return depth if all(held) else 0


def _layer_to_ours(sd, out, s, o, a, moe):
    """One decoder layer model.layers.N. (s) -> ours under prefix o; moe: its MLP is a MoE layer."""
    out[o + "input_layernorm.weight"] = sd[s + "input_layernorm.weight"]
    out[o + "pre_mlp_layernorm.weight"] = sd[s + "post_attention_layernorm.weight"]
    for hf, ours in _attention_names(a["q_lora_rank"]):
        out[f"{o}self_attention.{ours}.weight"] = sd[f"{s}self_attn.{hf}.weight"]
    if not moe:
        _dense_in(sd, out, s + "mlp.", o + "mlp.")
        return
    out[o + "mlp.router.weight"] = sd[s + "mlp.gate.weight"]
    out[o + "mlp.router.expert_bias"] = sd[s + "mlp.gate.e_score_correction_bias"].float()
    fc1, fc2 = _experts(sd, s + "mlp.experts.", a["num_experts"])
    if fc1.shape[0] != a["num_experts"]:
        _refuse(f"{s}mlp.experts holds {fc1.shape[0]} experts, config.json names {a['num_experts']}")
    for e in range(a["num_experts"]):
        out[o + _EXPERT.format(e) + "fc1_weight"], out[o + _EXPERT.format(e) + "fc2_weight"] = fc1[e], fc2[e]
    if a.get("moe_shared_expert_intermediate_size"):
        _dense_in(sd, out, s + "mlp.shared_experts.", o + "mlp.shared_experts.")


def _experts(sd, x, E):
    """(gate_up [E, 2f, h], down [E, h, f]): fused as the model holds them, or per expert as its files do."""
    if x + "gate_up_proj" in sd:
        return sd[x + "gate_up_proj"], sd[x + "down_proj"]
    fc1 = torch.stack([torch.cat([sd[f"{x}{e}.gate_proj.weight"], sd[f"{x}{e}.up_proj.weight"]]) for e in range(E)])
    return fc1, torch.stack([sd[f"{x}{e}.down_proj.weight"] for e in range(E)])


def _dense_in(sd, out, hf, ours):
    out[ours + "linear_fc1.weight"] = torch.cat([sd[hf + "gate_proj.weight"], sd[hf + "up_proj.weight"]])
    out[ours + "linear_fc2.weight"] = sd[hf + "down_proj.weight"]


def _dense_out(t, sd, ours, hf):
    sd[hf + "gate_proj.weight"], sd[hf + "up_proj.weight"] = t[ours + "linear_fc1.weight"].chunk(2)
    sd[hf + "down_proj.weight"] = t[ours + "linear_fc2.weight"]


def _layer_to_hf(t, sd, o, s, a, moe, buffers, per_expert=False):
    """Our layer under prefix o -> model.layers.N. (s); moe: its MLP is a MoE layer; per_expert: the experts
    named one by one (gate_proj / up_proj / down_proj), as the files hold them, instead of the model's fused
    gate_up_proj / down_proj."""
    E = a.get("num_experts") or 0
    sd[s + "input_layernorm.weight"] = t[o + "input_layernorm.weight"]
    sd[s + "post_attention_layernorm.weight"] = t[o + "pre_mlp_layernorm.weight"]
    for hf, ours in _attention_names(a.get("q_lora_rank")):
        sd[f"{s}self_attn.{hf}.weight"] = t[f"{o}self_attention.{ours}.weight"]
    if not moe:
        _dense_out(t, sd, o + "mlp.", s + "mlp.")
        return
    sd[s + "mlp.gate.weight"] = t[o + "mlp.router.weight"]
    bias = buffers.pop(o + "mlp.router.expert_bias", None)
    sd[s + "mlp.gate.e_score_correction_bias"] = torch.zeros(E) if bias is None else bias.float()
    fc1, fc2 = ([t[o + _EXPERT.format(e) + name] for e in range(E)] for name in ("fc1_weight", "fc2_weight"))
    if per_expert:
        for e in range(E):
            x = f"{s}mlp.experts.{e}."
            sd[x + "gate_proj.weight"], sd[x + "up_proj.weight"] = fc1[e].chunk(2)
            sd[x + "down_proj.weight"] = fc2[e]
    else:
        sd[s + "mlp.experts.gate_up_proj"], sd[s + "mlp.experts.down_proj"] = torch.stack(fc1), torch.stack(fc2)
    if a.get("moe_shared_expert_intermediate_size"):
        _dense_out(t, sd, o + "mlp.shared_experts.", s + "mlp.shared_experts.")


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


def ours_to_deepseek_v3(a, t, buffers):
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
    sd = {"model.embed_tokens.weight": t["word_embeddings.weight"],
          "model.norm.weight": t["decoder.final_layernorm.weight"],
          "lm_head.weight": t["output_layer.weight" if a["untie_embeddings_and_output_weights"]
                              else "word_embeddings.weight"]}
    for i in range(n):
        _layer_to_hf(t, sd, L.format(i), f"model.layers.{i}.", a, bool(E) and i >= k, buffers)
    for d in range(cfg["num_nextn_predict_layers"]):  # DeepSeek-V3's files hold them after the decoder's layers
        o, s = _MTP_LAYER.format(d), f"model.layers.{n + d}."
        _layer_to_hf(t, sd, o + "transformer_layer.", s, a, bool(E) and n + d >= k, buffers, per_expert=True)
        for hf, ours in _MTP_NAMES:
            sd[s + hf] = t[o + ours]
        sd[s + "embed_tokens.weight"], sd[s + "shared_head.head.weight"] = sd["model.embed_tokens.weight"], \
            sd["lm_head.weight"]
    t.refuse_unused()
    return cfg, {k_: v.contiguous() for k_, v in sd.items()}
