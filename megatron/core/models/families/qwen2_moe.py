"""Qwen2-MoE: Mixtral's attention, router and routed experts (mixtral.py), plus
  - q/k/v biases (qkv_bias; o_proj has none): --add-qkv-bias with --disable-bias-linear;
  - a shared expert on every token, scaled by sigmoid(shared_expert_gate . x):
    --moe-shared-expert-intermediate-size with --moe-shared-expert-gate (moe/shared_experts.py);
  - norm_topk_prob false (Qwen1.5-MoE's setting): the top-k of the softmax over all experts, not
    renormalised, is our --moe-router-pre-softmax; true is ours without it (softmax over the top-k).
Every layer must be sparse (decoder_sparse_step 1, no mlp_only_layers: our --moe-layer-freq puts
MoE layers at 1, 1 + freq, ..., HF's sparse step at step, 2 step, ...) and attend in full (no
sliding window). Both expert layouts are read (fused gate_up_proj / down_proj as transformers 5
writes; per expert experts.{e}.gate_proj / up_proj / down_proj as the Hub's files); fused is written.
HuggingFace Qwen2MoeForCausalLM.
"""
import re
import types

import torch

from ...checkpointing.hf_checks import take
from ...checkpointing.hf_conversion import L, qkv_from_ours, qkv_to_ours
from ...errors import CheckpointError
from . import mixtral
from .family import Family

_OWN = re.compile(r"\.mlp\.shared_expert(_gate|s)?\.|\.self_attn\.[qkv]_proj\.bias$|\.linear_qkv\.bias$")


def _check_hf(c):
    if c.decoder_sparse_step != 1 or c.mlp_only_layers:
        raise CheckpointError(f"Qwen2-MoE with dense layers (decoder_sparse_step {c.decoder_sparse_step}, "
                              f"mlp_only_layers {c.mlp_only_layers}) is not supported: every layer must be MoE")
    if c.use_sliding_window or c.hidden_act != "silu":
        raise CheckpointError("only SiLU Qwen2-MoE models without sliding-window attention are supported")


def _fuse_experts(sd, layers, experts):
    """Per-expert tensors -> the fused gate_up_proj [E, 2f, h] and down_proj [E, h, f], in place."""
    for i in range(layers):
        x = f"model.layers.{i}.mlp.experts."
        if x + "0.gate_proj.weight" in sd:
            sd[x + "gate_up_proj"] = torch.stack([torch.cat([take(sd, f"{x}{e}.gate_proj.weight"),
                                                             take(sd, f"{x}{e}.up_proj.weight")])
                                                  for e in range(experts)])
            sd[x + "down_proj"] = torch.stack([take(sd, f"{x}{e}.down_proj.weight") for e in range(experts)])


def _take_own(tensors):
    """Split off the tensors Mixtral lacks (shared expert, its gate, q/k/v biases) -> (rest, own)."""
    own = {k: v for k, v in tensors.items() if _OWN.search(k)}
    return {k: v for k, v in tensors.items() if k not in own}, own


def to_ours(config, sd):
    """Qwen2MoeForCausalLM config and state dict -> (model args, {init_key: tensor})."""
    _check_hf(config)
    sd = dict(sd)
    _fuse_experts(sd, config.num_hidden_layers, config.num_experts)
    sd, own = _take_own(sd)
    as_mixtral = {**config.to_dict(), "num_local_experts": config.num_experts,
                  "intermediate_size": config.moe_intermediate_size}
    view = types.SimpleNamespace(**as_mixtral, to_dict=lambda: as_mixtral)
    args, out = mixtral.to_ours(view, sd)
    n, g, d = args["num_attention_heads"], args["num_query_groups"], args["kv_channels"]
    for i in range(config.num_hidden_layers):
        s, o = f"model.layers.{i}.", L.format(i) + "mlp.shared_experts."
        if config.qkv_bias:
            out[L.format(i) + "self_attention.linear_qkv.bias"] = qkv_to_ours(
                *(take(own, f"{s}self_attn.{p}_proj.bias") for p in "qkv"), n, g, d)
        x = s + "mlp.shared_expert."
        out[o + "linear_fc1.weight"] = torch.cat([take(own, x + "gate_proj.weight"), take(own, x + "up_proj.weight")])
        out[o + "linear_fc2.weight"] = take(own, x + "down_proj.weight")
        out[o + "gate_weight"] = take(own, s + "mlp.shared_expert_gate.weight")
    if own:
        raise CheckpointError(f"the HuggingFace checkpoint has tensors this conversion does not use: {sorted(own)[:3]}")
    args.update(ffn_hidden_size=config.intermediate_size, add_qkv_bias=bool(config.qkv_bias),
                moe_shared_expert_intermediate_size=config.shared_expert_intermediate_size,
                moe_shared_expert_gate=True, moe_router_pre_softmax=not config.norm_topk_prob)
    return args, {k: v.contiguous() for k, v in out.items()}


def to_hf(a, t, buffers=None):
    """(model args with shared experts, global tensors) -> (Qwen2MoeConfig kwargs, state dict)."""
    if not a.get("moe_shared_expert_gate") or a.get("add_bias_linear") or a.get("moe_layer_freq", 1) != 1 \
            or a.get("moe_router_score_function", "softmax") != "softmax":
        raise CheckpointError("HF Qwen2-MoE needs shared experts with --moe-shared-expert-gate, "
                              "--disable-bias-linear, --moe-layer-freq 1 and softmax routing")
    t, own = _take_own(t)
    cfg, sd = mixtral.to_hf(dict(a, moe_router_pre_softmax=False), t)  # Qwen2-MoE has both normalisations
    cfg.update(num_experts=cfg.pop("num_local_experts"), moe_intermediate_size=cfg.pop("intermediate_size"),
               intermediate_size=a["ffn_hidden_size"], qkv_bias=bool(a.get("add_qkv_bias")),
               shared_expert_intermediate_size=a["moe_shared_expert_intermediate_size"],
               norm_topk_prob=not a.get("moe_router_pre_softmax"), decoder_sparse_step=1, mlp_only_layers=[],
               use_sliding_window=False)
    n, g, d = a["num_attention_heads"], a["num_query_groups"] or a["num_attention_heads"], a["kv_channels"]
    for i in range(a["num_layers"]):
        s, o = f"model.layers.{i}.", L.format(i) + "mlp.shared_experts."
        if a.get("add_qkv_bias"):
            q, k, v = qkv_from_ours(own.pop(L.format(i) + "self_attention.linear_qkv.bias"), n, g, d)
            sd.update({f"{s}self_attn.q_proj.bias": q, f"{s}self_attn.k_proj.bias": k, f"{s}self_attn.v_proj.bias": v})
        x = s + "mlp.shared_expert."
        sd[x + "gate_proj.weight"], sd[x + "up_proj.weight"] = own.pop(o + "linear_fc1.weight").chunk(2)
        sd[x + "down_proj.weight"] = own.pop(o + "linear_fc2.weight")
        sd[s + "mlp.shared_expert_gate.weight"] = own.pop(o + "gate_weight")
    if own:
        raise CheckpointError(f"the checkpoint has tensors HF Qwen2-MoE has no place for: {sorted(own)[:3]}")
    return cfg, {k: v.contiguous() for k, v in sd.items()}


FAMILY = Family(
    name="qwen2_moe", title="Qwen2-MoE", model_type="GPT",
    switches={"encoder": False, "attention": "standard", "qk_norm": False, "experts": True, "shared_experts": True},
    preset=dict(mixtral.FAMILY.preset, moe_shared_expert_gate=True), hf_model_type="qwen2_moe",
    hf_config_class="Qwen2MoeConfig", hf_model_class="Qwen2MoeForCausalLM",
    hf_required_keys=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "max_position_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                      "shared_expert_intermediate_size"),
    to_ours=to_ours, to_hf=to_hf)
