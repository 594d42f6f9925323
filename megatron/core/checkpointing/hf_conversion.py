"""HuggingFace GPT-2 / Llama state dicts <-> our global tensors (keyed by init_key).

Pure tensor re-arrangement, no transformers import: the caller loads and saves the HF
model. Our layout differences:
  - fused QKV [(heads + 2 groups) x d, h] ordered per query group: that group's q heads,
    then its k head, then its v head (attention.py), so a TP split gives whole groups;
    HF keeps q, k, v apart (Llama) or as [q_all; k_all; v_all] (GPT-2's c_attn);
  - GPT-2's Conv1D weights are [in, out]: transposed against nn.Linear's [out, in];
  - SwiGLU fc1 is [gate; up] (Llama's gate_proj and up_proj stacked);
  - RoPE is rotate-half, as HF Llama, so q/k rows need no permutation;
  - an untied output layer (output_layer.weight) is HF's lm_head with tie_word_embeddings false.
Every tensor of the source must be used and the model must fit the family (hf_checks.py).
"""
import torch

from .hf_checks import TrackedTensors, hf_family, same_as_tied
from .pieces import CheckpointError

L = "decoder.layers.{}."


def qkv_to_ours(q, k, v, heads, groups, d):
    """q [heads d, ...], k/v [groups d, ...] -> [(heads + 2 groups) d, ...] grouped per query group."""
    rest = q.shape[1:]
    q = q.reshape(groups, heads // groups, d, *rest)
    k, v = k.reshape(groups, 1, d, *rest), v.reshape(groups, 1, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape((heads + 2 * groups) * d, *rest)


def qkv_from_ours(w, heads, groups, d):
    """Inverse of qkv_to_ours: -> (q, k, v)."""
    rest, per = w.shape[1:], heads // groups
    w = w.reshape(groups, per + 2, d, *rest)
    return (w[:, :per].reshape(heads * d, *rest), w[:, per].reshape(groups * d, *rest),
            w[:, per + 1].reshape(groups * d, *rest))


def _gpt2_args(c):
    if c.activation_function not in ("gelu_new", "gelu", "gelu_pytorch_tanh"):
        raise CheckpointError(f"GPT-2 activation {c.activation_function!r} is not supported")
    if c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn or not c.scale_attn_weights:
        raise CheckpointError("GPT-2 attention-scaling variants are not supported")
    return dict(num_layers=c.n_layer, hidden_size=c.n_embd, num_attention_heads=c.n_head,
                ffn_hidden_size=c.n_inner or 4 * c.n_embd, seq_length=c.n_positions,
                max_position_embeddings=c.n_positions, position_embedding_type="learned_absolute",
                normalization="LayerNorm", norm_epsilon=c.layer_norm_epsilon, swiglu=False,
                openai_gelu=c.activation_function != "gelu", add_bias_linear=True,
                untie_embeddings_and_output_weights=not c.tie_word_embeddings, hidden_dropout=c.resid_pdrop,
                attention_dropout=c.attn_pdrop, vocab_size=c.vocab_size)


_GPT2_BUFFERS = r"^h\.\d+\.attn\.(masked_)?bias$"  # causal-mask buffers older GPT-2 files carry


def gpt2_to_ours(config, sd):
    """GPT2LMHeadModel config and state dict -> (model args, {init_key: tensor})."""
    a = _gpt2_args(config)
    h, n = a["hidden_size"], a["num_attention_heads"]
    sd = TrackedTensors({k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()},
                        "the HuggingFace checkpoint")
    out = {"word_embeddings.weight": sd["wte.weight"], "position_embeddings": sd["wpe.weight"],
           "decoder.final_layernorm.weight": sd["ln_f.weight"], "decoder.final_layernorm.bias": sd["ln_f.bias"]}
    if a["untie_embeddings_and_output_weights"]:
        out["output_layer.weight"] = sd["lm_head.weight"]
    else:
        same_as_tied(sd, "lm_head.weight", "wte.weight")
    for i in range(a["num_layers"]):
        s, o = f"h.{i}.", L.format(i)
        for ours, hf in (("input_layernorm", "ln_1"), ("pre_mlp_layernorm", "ln_2")):
            out[o + ours + ".weight"], out[o + ours + ".bias"] = sd[s + hf + ".weight"], sd[s + hf + ".bias"]
        for suffix, t in (("weight", sd[s + "attn.c_attn.weight"].t()), ("bias", sd[s + "attn.c_attn.bias"])):
            out[o + "self_attention.linear_qkv." + suffix] = qkv_to_ours(*t.split(h), n, n, h // n)
        for ours, hf in (("self_attention.linear_proj", "attn.c_proj"), ("mlp.linear_fc1", "mlp.c_fc"),
                         ("mlp.linear_fc2", "mlp.c_proj")):
            out[o + ours + ".weight"] = sd[s + hf + ".weight"].t()
            out[o + ours + ".bias"] = sd[s + hf + ".bias"]
    sd.refuse_unused(ignore=_GPT2_BUFFERS)
    return a, {k: v.contiguous() for k, v in out.items()}


def ours_to_gpt2(a, t):
    """(model args, global tensors) -> (GPT2Config kwargs, GPT2LMHeadModel state dict)."""
    if hf_family(a) != "gpt2":
        raise CheckpointError("a rope model converts to HF Llama, not GPT-2 (position_embedding_type decides)")
    t = TrackedTensors(t, "the checkpoint")
    h, n = a["hidden_size"], a["num_attention_heads"]
    untied = a["untie_embeddings_and_output_weights"]
    cfg = dict(vocab_size=a["vocab_size"], n_positions=a["max_position_embeddings"], n_embd=h,
               n_layer=a["num_layers"], n_head=n, n_inner=a["ffn_hidden_size"],
               activation_function="gelu_new" if a.get("openai_gelu") else "gelu",
               layer_norm_epsilon=a["norm_epsilon"], resid_pdrop=a["hidden_dropout"],
               embd_pdrop=a["hidden_dropout"], attn_pdrop=a["attention_dropout"], tie_word_embeddings=not untied)
    sd = {"wte.weight": t["word_embeddings.weight"], "wpe.weight": t["position_embeddings"],
          "ln_f.weight": t["decoder.final_layernorm.weight"], "ln_f.bias": t["decoder.final_layernorm.bias"]}
    for i in range(a["num_layers"]):
        s, o = f"h.{i}.", L.format(i)
        for ours, hf in (("input_layernorm", "ln_1"), ("pre_mlp_layernorm", "ln_2")):
            sd[s + hf + ".weight"], sd[s + hf + ".bias"] = t[o + ours + ".weight"], t[o + ours + ".bias"]
        sd[s + "attn.c_attn.weight"] = torch.cat(
            qkv_from_ours(t[o + "self_attention.linear_qkv.weight"], n, n, h // n)).t()
        sd[s + "attn.c_attn.bias"] = torch.cat(qkv_from_ours(t[o + "self_attention.linear_qkv.bias"], n, n, h // n))
        for ours, hf in (("self_attention.linear_proj", "attn.c_proj"), ("mlp.linear_fc1", "mlp.c_fc"),
                         ("mlp.linear_fc2", "mlp.c_proj")):
            sd[s + hf + ".weight"] = t[o + ours + ".weight"].t()
            sd[s + hf + ".bias"] = t[o + ours + ".bias"]
    sd = {"transformer." + k: v.contiguous() for k, v in sd.items()}
    sd["lm_head.weight"] = t["output_layer.weight"].contiguous() if untied else sd["transformer.wte.weight"]
    t.refuse_unused()
    return cfg, sd


def _rope_theta(c):
    rp = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    if rp.get("rope_type", rp.get("type", "default")) != "default":
        raise CheckpointError(f"Llama RoPE scaling {rp.get('rope_type')!r} is not supported")
    return rp.get("rope_theta", getattr(c, "rope_theta", 10000.0))


def _llama_args(c):
    if c.hidden_act != "silu" or c.attention_bias != c.mlp_bias:
        raise CheckpointError("only SiLU Llama models with the same bias setting for attention and MLP are supported")
    theta = _rope_theta(c)
    if float(theta) != int(theta):
        raise CheckpointError(f"rope theta {theta} is not an integer")
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return dict(num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                kv_channels=d, group_query_attention=c.num_key_value_heads != c.num_attention_heads,
                num_query_groups=c.num_key_value_heads, ffn_hidden_size=c.intermediate_size,
                seq_length=c.max_position_embeddings, max_position_embeddings=c.max_position_embeddings,
                position_embedding_type="rope", rotary_base=int(theta), normalization="RMSNorm",
                norm_epsilon=c.rms_norm_eps, swiglu=True, openai_gelu=False, add_bias_linear=bool(c.attention_bias),
                untie_embeddings_and_output_weights=not c.tie_word_embeddings, hidden_dropout=0.0,
                attention_dropout=c.attention_dropout, vocab_size=c.vocab_size)


_LLAMA_LAYER = (("input_layernorm.weight", "input_layernorm.weight"),
                ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
                ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
                ("mlp.down_proj.weight", "mlp.linear_fc2.weight"))


def ends_to_ours(sd, untied):
    """Llama-style model.embed_tokens, model.norm and lm_head (a TrackedTensors) -> our tensors of the ends."""
    out = {"word_embeddings.weight": sd["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": sd["model.norm.weight"]}
    if untied:
        out["output_layer.weight"] = sd["lm_head.weight"]
    else:
        same_as_tied(sd, "lm_head.weight", "model.embed_tokens.weight")
    return out


def llama_to_ours(config, sd):
    """LlamaForCausalLM config and state dict -> (model args, {init_key: tensor})."""
    a = _llama_args(config)
    sd = TrackedTensors(sd, "the HuggingFace checkpoint")
    n, g, d = a["num_attention_heads"], a["num_query_groups"], a["kv_channels"]
    out = ends_to_ours(sd, a["untie_embeddings_and_output_weights"])
    for i in range(a["num_layers"]):
        s, o = f"model.layers.{i}.", L.format(i)
        for hf, ours in _LLAMA_LAYER:
            out[o + ours] = sd[s + hf]
        suffixes = ("weight", "bias") if a["add_bias_linear"] else ("weight",)
        for x in suffixes:
            out[o + "self_attention.linear_qkv." + x] = qkv_to_ours(
                *(sd[f"{s}self_attn.{p}_proj.{x}"] for p in "qkv"), n, g, d)
            out[o + "mlp.linear_fc1." + x] = torch.cat([sd[s + "mlp.gate_proj." + x], sd[s + "mlp.up_proj." + x]])
        if a["add_bias_linear"]:
            out[o + "self_attention.linear_proj.bias"] = sd[s + "self_attn.o_proj.bias"]
            out[o + "mlp.linear_fc2.bias"] = sd[s + "mlp.down_proj.bias"]
    sd.refuse_unused(ignore=r"rotary_emb\.inv_freq$")
    return a, {k: v.contiguous() for k, v in out.items()}


def ours_to_llama(a, t):
    """(model args, global tensors) -> (LlamaConfig kwargs, LlamaForCausalLM state dict)."""
    if hf_family(a) != "llama":
        raise CheckpointError("a model with learned absolute positions converts to HF GPT-2, not Llama")
    t = TrackedTensors(t, "the checkpoint")
    n, g, d = a["num_attention_heads"], a["num_query_groups"] or a["num_attention_heads"], a["kv_channels"]
    bias = a["add_bias_linear"]
    cfg = dict(vocab_size=a["vocab_size"], hidden_size=a["hidden_size"], intermediate_size=a["ffn_hidden_size"],
               num_hidden_layers=a["num_layers"], num_attention_heads=n, num_key_value_heads=g, head_dim=d,
               max_position_embeddings=a["max_position_embeddings"], rms_norm_eps=a["norm_epsilon"],
               rope_theta=float(a["rotary_base"]), attention_bias=bias, mlp_bias=bias, hidden_act="silu",
               attention_dropout=a["attention_dropout"],
               tie_word_embeddings=not a["untie_embeddings_and_output_weights"])
    sd = {"model.embed_tokens.weight": t["word_embeddings.weight"],
          "model.norm.weight": t["decoder.final_layernorm.weight"],
          "lm_head.weight": t["output_layer.weight" if a["untie_embeddings_and_output_weights"]
                              else "word_embeddings.weight"]}
    for i in range(a["num_layers"]):
        s, o = f"model.layers.{i}.", L.format(i)
        for hf, ours in _LLAMA_LAYER:
            sd[s + hf] = t[o + ours]
        for x in ("weight", "bias") if bias else ("weight",):
            for p, v in zip("qkv", qkv_from_ours(t[o + "self_attention.linear_qkv." + x], n, g, d)):
                sd[f"{s}self_attn.{p}_proj.{x}"] = v
            sd[s + "mlp.gate_proj." + x], sd[s + "mlp.up_proj." + x] = t[o + "mlp.linear_fc1." + x].chunk(2)
        if bias:
            sd[s + "self_attn.o_proj.bias"] = t[o + "self_attention.linear_proj.bias"]
            sd[s + "mlp.down_proj.bias"] = t[o + "mlp.linear_fc2.bias"]
    t.refuse_unused()
    return cfg, {k: v.contiguous() for k, v in sd.items()}
