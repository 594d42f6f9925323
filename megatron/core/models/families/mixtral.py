"""Mixtral: Llama's attention, norms and embeddings (llama.py), and per layer a router and E SwiGLU experts;
HuggingFace MixtralForCausalLM.

Both of transformers' expert layouts are read: fused (mlp.experts.gate_up_proj [E, 2f, h] =
[gate; up] per expert, mlp.experts.down_proj [E, h, f], mlp.gate.weight) and per expert
(block_sparse_moe.experts.{e}.w1 / w3 / w2, block_sparse_moe.gate.weight); the fused one is
written. Mixtral routes by softmax over all experts, top-k, renormalised: the same as ours
(softmax over the top-k logits) without --moe-router-pre-softmax.
"""
import re
import types

import torch

from ...checkpointing.hf_checks import TrackedTensors
from ...checkpointing.hf_conversion import L
from ...errors import CheckpointError
from . import llama
from .family import Family

_EXPERT = L + "mlp.experts.local_experts.{}."


def _dense_stand_ins(layers, ffn, h):
    """Zero dense-MLP tensors for the Llama converter (whose MLP part they are; dropped after)."""
    shapes = {"gate_proj.weight": (ffn, h), "up_proj.weight": (ffn, h), "down_proj.weight": (h, ffn)}
    return {f"model.layers.{i}.mlp.{n}": torch.zeros(s) for i in range(layers) for n, s in shapes.items()}


def to_ours(config, sd):
    """MixtralForCausalLM config and state dict -> (model args, {init_key: tensor})."""
    c = types.SimpleNamespace(**{**config.to_dict(), "attention_bias": False, "mlp_bias": False,
                                 "hidden_act": config.hidden_act})
    c.rope_parameters = getattr(config, "rope_parameters", None)
    E, h, f = config.num_local_experts, config.hidden_size, config.intermediate_size
    moe, rest = {}, {}
    for k, v in sd.items():
        (moe if re.search(r"\.(mlp|block_sparse_moe)\.(gate|experts)\.", k) else rest)[k] = v
    moe = TrackedTensors(moe, "the HuggingFace checkpoint")  # a missing expert: one line; one too many: refused
    rest.update(_dense_stand_ins(config.num_hidden_layers, f, h))
    args, out = llama.to_ours(c, rest)
    for i in range(config.num_hidden_layers):
        for n in ("linear_fc1.weight", "linear_fc2.weight"):
            del out[L.format(i) + "mlp." + n]
        s = f"model.layers.{i}."
        if s + "mlp.experts.gate_up_proj" in moe:
            router, fc1, fc2 = moe[s + "mlp.gate.weight"], moe[s + "mlp.experts.gate_up_proj"], \
                moe[s + "mlp.experts.down_proj"]
            if fc1.shape[0] != E or fc2.shape[0] != E:
                raise CheckpointError(f"{s}mlp.experts.gate_up_proj holds {fc1.shape[0]} experts, config.json "
                                      f"names {E} (num_local_experts / num_experts): the weights are another model's")
        else:
            x = s + "block_sparse_moe."
            router = moe[x + "gate.weight"]
            fc1 = torch.stack([torch.cat([moe[f"{x}experts.{e}.w1.weight"], moe[f"{x}experts.{e}.w3.weight"]])
                               for e in range(E)])
            fc2 = torch.stack([moe[f"{x}experts.{e}.w2.weight"] for e in range(E)])
        out[L.format(i) + "mlp.router.weight"] = router.contiguous()
        for e in range(E):
            out[_EXPERT.format(i, e) + "fc1_weight"] = fc1[e].contiguous()
            out[_EXPERT.format(i, e) + "fc2_weight"] = fc2[e].contiguous()
    moe.refuse_unused()
    args.update(num_experts=E, moe_router_topk=config.num_experts_per_tok, moe_ffn_hidden_size=f,
                moe_aux_loss_coeff=float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0))
    return args, out


def to_hf(a, t, buffers=None):
    """(model args with num_experts, global tensors) -> (MixtralConfig kwargs, state dict, fused experts)."""
    if a.get("moe_router_pre_softmax") or a.get("moe_router_score_function", "softmax") != "softmax" \
            or a.get("moe_layer_freq", 1) != 1:  # transformers would route differently, silently
        raise CheckpointError("HF Mixtral routes every layer by a softmax over the top-k logits: the model needs "
                              "softmax scores without --moe-router-pre-softmax, and --moe-layer-freq 1")
    E, h = a["num_experts"], a["hidden_size"]
    f = a.get("moe_ffn_hidden_size") or a["ffn_hidden_size"]
    dense, moe = {}, {}
    for k, v in t.items():
        (moe if re.search(r"\.mlp\.(router|experts)\.", k) else dense)[k] = v
    for i in range(a["num_layers"]):  # zero stand-ins for the Llama converter's dense MLP, dropped after
        dense[L.format(i) + "mlp.linear_fc1.weight"] = torch.zeros(2 * f, h)
        dense[L.format(i) + "mlp.linear_fc2.weight"] = torch.zeros(h, f)
    cfg, sd = llama.to_hf(dict(a, ffn_hidden_size=f), dense)
    for i in range(a["num_layers"]):
        s = f"model.layers.{i}."
        for n in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
            del sd[s + "mlp." + n]
        sd[s + "mlp.gate.weight"] = moe[L.format(i) + "mlp.router.weight"]
        sd[s + "mlp.experts.gate_up_proj"] = torch.stack([moe[_EXPERT.format(i, e) + "fc1_weight"] for e in range(E)])
        sd[s + "mlp.experts.down_proj"] = torch.stack([moe[_EXPERT.format(i, e) + "fc2_weight"] for e in range(E)])
    cfg = {k: v for k, v in cfg.items() if k not in ("mlp_bias", "attention_bias")}
    cfg.update(num_local_experts=E, num_experts_per_tok=a["moe_router_topk"], intermediate_size=f,
               router_aux_loss_coef=a.get("moe_aux_loss_coeff") or 0.0)
    return cfg, sd


FAMILY = Family(
    name="mixtral", title="Mixtral", model_type="GPT",
    switches={"encoder": False, "attention": "standard", "qk_norm": False, "experts": True, "shared_experts": False},
    preset=dict(llama.PRESET, add_bias_linear=False), hf_model_type="mixtral", hf_config_class="MixtralConfig",
    hf_model_class="MixtralForCausalLM",
    hf_required_keys=("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "max_position_embeddings", "num_local_experts", "num_experts_per_tok"),
    to_ours=to_ours, to_hf=to_hf)
