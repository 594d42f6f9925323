"""DeepSeek-V3's tensor names <-> ours, layer by layer (deepseek_v3.py holds the family and its config):
attention (query compressed or not), dense or MoE MLPs with the router's expert bias, shared experts, and the
multi-token prediction modules, which DeepSeek-V3's files hold as layers L .. L + D - 1."""
import torch

from ...checkpointing.hf_checks import same_as_tied
from ...checkpointing.hf_conversion import L
from ...errors import CheckpointError

_Q_LORA = (("q_a_proj", "linear_q_down_proj"), ("q_a_layernorm", "q_layernorm"), ("q_b_proj", "linear_q_up_proj"))
_Q_DIRECT = (("q_proj", "linear_q_proj"),)
_KV_O = (("kv_a_proj_with_mqa", "linear_kv_down_proj"), ("kv_a_layernorm", "kv_layernorm"),
         ("kv_b_proj", "linear_kv_up_proj"), ("o_proj", "linear_proj"))


def _attention_names(q_lora_rank):
    """(HF name, our name) of one layer's attention weights."""
    return (_Q_DIRECT if q_lora_rank is None else _Q_LORA) + _KV_O


_EXPERT = "mlp.experts.local_experts.{}."
_MTP_LAYER = "mtp.layers.{}."
# a multi-token prediction module's own weights (HF under model.layers.{L + k}., ours under mtp.layers.{k}.);
# its embed_tokens and shared_head.head are the model's (ours shares them)
_MTP_NAMES = (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"), ("eh_proj.weight", "eh_proj.weight"),
              ("shared_head.norm.weight", "final_layernorm.weight"))


def _mtp_depth(config, sd, n):
    """How many multi-token prediction modules the files hold: num_nextn_predict_layers where model.layers.{n}..
    are there (DeepSeek-V3's files), 0 where none is (transformers writes none: its model has no MTP)."""
    depth = getattr(config, "num_nextn_predict_layers", 0) or 0
    held = [f"model.layers.{n + k}.eh_proj.weight" in sd for k in range(depth)]
    if any(held) and not all(held):
        raise CheckpointError(f"HF DeepSeek-V3 conversion: config.json names {depth} multi-token prediction "
                              f"layers; the files hold {sum(held)}")
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
        raise CheckpointError(f"HF DeepSeek-V3 conversion: {s}mlp.experts holds {fc1.shape[0]} experts, "
                              f"config.json names {a['num_experts']}")
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


def layers_to_ours(config, sd, out, a, moe_from):
    """The decoder layers and the multi-token prediction modules the files hold (model.layers.{L + k}, as
    DeepSeek-V3's do) of `sd` (a TrackedTensors) into `out`; layers from moe_from on are MoE layers. Sets
    a["mtp_num_layers"] to the modules read."""
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


def layers_to_hf(t, sd, a, moe_from, buffers, depth):
    """layers_to_ours' inverse, `depth` multi-token prediction modules written after the decoder's layers
    with their experts one by one (as DeepSeek-V3's files name them)."""
    n, moe = a["num_layers"], bool(a.get("num_experts"))
    for i in range(n):
        _layer_to_hf(t, sd, L.format(i), f"model.layers.{i}.", a, moe and i >= moe_from, buffers)
    for d in range(depth):
        o, s = _MTP_LAYER.format(d), f"model.layers.{n + d}."
        _layer_to_hf(t, sd, o + "transformer_layer.", s, a, moe and n + d >= moe_from, buffers, per_expert=True)
        for hf, ours in _MTP_NAMES:
            sd[s + hf] = t[o + ours]
        sd[s + "embed_tokens.weight"], sd[s + "shared_head.head.weight"] = sd["model.embed_tokens.weight"], \
            sd["lm_head.weight"]
