"""Llama: rotary positions (rotate-half, as ours: q / k rows need no permutation), pre-norm RMSNorm, SwiGLU
(HF's gate_proj and up_proj stacked into our fc1 [gate; up]), grouped-query attention (HF's separate q, k, v
regrouped per query group), with or without linear biases, tied or untied output; LlamaForCausalLM."""
import torch

from ...checkpointing.hf_checks import TrackedTensors
from ...checkpointing.hf_conversion import L, ends_from_ours, ends_to_ours, qkv_from_ours, qkv_to_ours
from ...errors import CheckpointError
from .family import Family

SHAPE = ("HF Llama holds --position-embedding-type rope, pre-norm RMSNorm layers, SwiGLU, "
         "grouped-query attention, tied or untied output, with or without linear biases")
PRESET = {"position_embedding_type": "rope", "normalization": "RMSNorm", "swiglu": True}
LAYER = (("input_layernorm.weight", "input_layernorm.weight"),
         ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
         ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
         ("mlp.down_proj.weight", "mlp.linear_fc2.weight"))


def check_dense_rope(a, shape=SHAPE):
    """CheckpointError (one line) for a model without Llama's rope, pre-norm RMSNorm and SwiGLU layers."""
    why = ("learned absolute positions" if a["position_embedding_type"] != "rope" else
           "post-norm layers" if a.get("post_norm") else
           None if a["normalization"] == "RMSNorm" and a.get("swiglu") else
           f"{a['normalization']} with {'SwiGLU' if a.get('swiglu') else 'GeLU'}")
    if why:
        raise CheckpointError(f"this model has {why}, which no HuggingFace family we convert to holds: {shape}")


def rope_theta(c):
    """The integer RoPE base of HF config `c` (plain RoPE only: CheckpointError for a scaled one)."""
    rp = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    if rp.get("rope_type", rp.get("type", "default")) != "default":
        raise CheckpointError(f"RoPE scaling {rp.get('rope_type')!r} is not supported")
    theta = rp.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    if float(theta) != int(theta):
        raise CheckpointError(f"rope theta {theta} is not an integer")
    return int(theta)


def dense_rope_args(c, preset=PRESET):
    """Our args of a Llama-shaped HF config `c` (Llama, Mixtral's and Qwen3's attention and ends)."""
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return dict(preset, num_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
                num_attention_heads=c.num_attention_heads, kv_channels=d,
                group_query_attention=c.num_key_value_heads != c.num_attention_heads,
                num_query_groups=c.num_key_value_heads, ffn_hidden_size=c.intermediate_size,
                seq_length=c.max_position_embeddings, max_position_embeddings=c.max_position_embeddings,
                rotary_base=rope_theta(c), norm_epsilon=c.rms_norm_eps, openai_gelu=False,
                untie_embeddings_and_output_weights=not c.tie_word_embeddings, hidden_dropout=0.0,
                attention_dropout=c.attention_dropout, vocab_size=c.vocab_size)


def hf_dense_rope_config(a):
    """The LlamaConfig-shaped kwargs of our args `a` (Qwen3Config and MixtralConfig take the same names)."""
    g = a["num_query_groups"] or a["num_attention_heads"]
    return dict(vocab_size=a["vocab_size"], hidden_size=a["hidden_size"], intermediate_size=a["ffn_hidden_size"],
                num_hidden_layers=a["num_layers"], num_attention_heads=a["num_attention_heads"],
                num_key_value_heads=g, head_dim=a["kv_channels"], max_position_embeddings=a["max_position_embeddings"],
                rms_norm_eps=a["norm_epsilon"], rope_theta=float(a["rotary_base"]), hidden_act="silu",
                attention_dropout=a["attention_dropout"],
                tie_word_embeddings=not a["untie_embeddings_and_output_weights"])


def _args(c):
    if c.hidden_act != "silu" or c.attention_bias != c.mlp_bias:
        raise CheckpointError("only SiLU Llama models with the same bias setting for attention and MLP are supported")
    return dict(dense_rope_args(c), add_bias_linear=bool(c.attention_bias))


def layers_to_ours(sd, out, a, bias=False):
    """Each layer's norms, attention and dense SwiGLU MLP of Llama-named `sd` (a TrackedTensors) into `out`."""
    n, g, d = a["num_attention_heads"], a["num_query_groups"], a["kv_channels"]
    for i in range(a["num_layers"]):
        s, o = f"model.layers.{i}.", L.format(i)
        for hf, ours in LAYER:
            out[o + ours] = sd[s + hf]
        for x in ("weight", "bias") if bias else ("weight",):
            out[o + "self_attention.linear_qkv." + x] = qkv_to_ours(
                *(sd[f"{s}self_attn.{p}_proj.{x}"] for p in "qkv"), n, g, d)
            out[o + "mlp.linear_fc1." + x] = torch.cat([sd[s + "mlp.gate_proj." + x], sd[s + "mlp.up_proj." + x]])
        if bias:
            out[o + "self_attention.linear_proj.bias"] = sd[s + "self_attn.o_proj.bias"]
            out[o + "mlp.linear_fc2.bias"] = sd[s + "mlp.down_proj.bias"]


def layers_to_hf(t, sd, a, bias=False):
    """layers_to_ours' inverse: our tensors `t` (a TrackedTensors) into the Llama-named `sd`."""
    n, g, d = a["num_attention_heads"], a["num_query_groups"] or a["num_attention_heads"], a["kv_channels"]
    for i in range(a["num_layers"]):
        s, o = f"model.layers.{i}.", L.format(i)
        for hf, ours in LAYER:
            sd[s + hf] = t[o + ours]
        for x in ("weight", "bias") if bias else ("weight",):
            for p, v in zip("qkv", qkv_from_ours(t[o + "self_attention.linear_qkv." + x], n, g, d)):
                sd[f"{s}self_attn.{p}_proj.{x}"] = v
            sd[s + "mlp.gate_proj." + x], sd[s + "mlp.up_proj." + x] = t[o + "mlp.linear_fc1." + x].chunk(2)
        if bias:
            sd[s + "self_attn.o_proj.bias"] = t[o + "self_attention.linear_proj.bias"]
            sd[s + "mlp.down_proj.bias"] = t[o + "mlp.linear_fc2.bias"]


def to_ours(config, sd):
    """LlamaForCausalLM config and state dict -> (model args, {init_key: tensor})."""
    a = _args(config)
    sd = TrackedTensors(sd, "the HuggingFace checkpoint")
    out = ends_to_ours(sd, a["untie_embeddings_and_output_weights"])
    layers_to_ours(sd, out, a, a["add_bias_linear"])
    sd.refuse_unused(ignore=r"rotary_emb\.inv_freq$")
    return a, {k: v.contiguous() for k, v in out.items()}


def to_hf(a, t, buffers=None):
    """(model args, global tensors) -> (LlamaConfig kwargs, LlamaForCausalLM state dict)."""
    check_dense_rope(a)
    t = TrackedTensors(t, "the checkpoint")
    bias = a["add_bias_linear"]
    cfg = dict(hf_dense_rope_config(a), attention_bias=bias, mlp_bias=bias)
    sd = ends_from_ours(t, a["untie_embeddings_and_output_weights"])
    layers_to_hf(t, sd, a, bias)
    t.refuse_unused()
    return cfg, {k: v.contiguous() for k, v in sd.items()}


FAMILY = Family(
    name="llama", title="Llama", model_type="GPT",
    switches={"encoder": False, "attention": "standard", "qk_norm": False, "experts": False, "positions": "rope"},
    preset=PRESET, hf_model_type="llama", hf_config_class="LlamaConfig", hf_model_class="LlamaForCausalLM",
    hf_required_keys=("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "max_position_embeddings"),
    to_ours=to_ours, to_hf=to_hf)
