"""Qwen3 (dense): Llama's layers (llama.py) with --qk-layernorm, an RMSNorm over each head of q and of k before
RoPE (HF's self_attn.q_norm / k_norm, our self_attention.q_layernorm / k_layernorm), no linear biases, and
kv-channels (HF's head_dim) free of hidden / heads; tied or untied output. HuggingFace Qwen3ForCausalLM.

HF's attention_bias puts biases on q, k, v and o but none on the MLP, which no flag of ours gives
(--add-qkv-bias leaves o without one, --add-bias-linear adds the MLP's): refused, as sliding-window layers."""
from ...checkpointing.hf_checks import TrackedTensors
from ...checkpointing.hf_conversion import L, ends_from_ours, ends_to_ours
from ...errors import CheckpointError
from . import llama
from .family import Family

SHAPE = ("HF Qwen3 holds --qk-layernorm with --position-embedding-type rope, pre-norm RMSNorm layers, SwiGLU, "
         "grouped-query attention, --disable-bias-linear, tied or untied output")
PRESET = dict(llama.PRESET, qk_layernorm=True, add_bias_linear=False)
_QK_NORMS = (("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
             ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"))


def _args(c):
    if c.hidden_act != "silu" or c.attention_bias:
        raise CheckpointError("only SiLU Qwen3 models without attention_bias are supported (its biases on q, k, v "
                              "and the output projection but not the MLP are no layout of ours)")
    if c.use_sliding_window or any(kind != "full_attention" for kind in c.layer_types or ()):
        raise CheckpointError("Qwen3 with sliding-window layers is not supported: every layer must attend in full")
    return llama.dense_rope_args(c, PRESET)


def to_ours(config, sd):
    """Qwen3ForCausalLM config and state dict -> (model args, {init_key: tensor})."""
    a = _args(config)
    sd = TrackedTensors(sd, "the HuggingFace checkpoint")
    out = ends_to_ours(sd, a["untie_embeddings_and_output_weights"])
    llama.layers_to_ours(sd, out, a)
    for i in range(a["num_layers"]):
        for hf, ours in _QK_NORMS:
            out[L.format(i) + ours] = sd[f"model.layers.{i}.{hf}"]
    sd.refuse_unused(ignore=r"rotary_emb\.inv_freq$")
    return a, {k: v.contiguous() for k, v in out.items()}


def to_hf(a, t, buffers=None):
    """(model args, global tensors) -> (Qwen3Config kwargs, Qwen3ForCausalLM state dict)."""
    llama.check_dense_rope(a, SHAPE)
    if a.get("add_bias_linear", True) or a.get("add_qkv_bias"):
        raise CheckpointError(f"this model has linear biases, which no HuggingFace family we convert to holds: {SHAPE}")
    t = TrackedTensors(t, "the checkpoint")
    cfg = dict(llama.hf_dense_rope_config(a), attention_bias=False, use_sliding_window=False)
    sd = ends_from_ours(t, a["untie_embeddings_and_output_weights"])
    llama.layers_to_hf(t, sd, a)
    for i in range(a["num_layers"]):
        for hf, ours in _QK_NORMS:
            sd[f"model.layers.{i}.{hf}"] = t[L.format(i) + ours]
    t.refuse_unused()
    return cfg, {k: v.contiguous() for k, v in sd.items()}


FAMILY = Family(
    name="qwen3", title="Qwen3", model_type="GPT",
    switches={"encoder": False, "attention": "standard", "qk_norm": True, "experts": False},
    preset=PRESET, hf_model_type="qwen3", hf_config_class="Qwen3Config", hf_model_class="Qwen3ForCausalLM",
    hf_required_keys=llama.FAMILY.hf_required_keys + ("num_key_value_heads", "head_dim"),
    to_ours=to_ours, to_hf=to_hf)
