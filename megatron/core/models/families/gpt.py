"""GPT (GPT-2's shape): learned absolute positions, pre-norm LayerNorm, GeLU, linear biases, tied or untied
output; HuggingFace GPT2LMHeadModel. GPT-2's Conv1D weights are [in, out], transposed against nn.Linear's
[out, in], and its c_attn is [q_all; k_all; v_all], which our fused QKV regroups per query group
(checkpointing/hf_conversion.py)."""
import torch

from ...checkpointing.hf_checks import TrackedTensors, same_as_tied
from ...checkpointing.hf_conversion import L, qkv_from_ours, qkv_to_ours
from ...errors import CheckpointError
from .family import Family
from .llama import SHAPE as LLAMA_SHAPE

SHAPE = ("HF GPT-2 holds learned absolute positions, pre-norm LayerNorm layers, GeLU, "
         "linear biases, tied or untied output, no grouped-query attention and kv-channels = hidden / heads")
PRESET = {"position_embedding_type": "learned_absolute", "normalization": "LayerNorm", "swiglu": False}


def _check(a):
    """CheckpointError (one line) for a model GPT-2 cannot hold."""
    n = a["num_attention_heads"]
    groups, kv = a.get("num_query_groups") or n, a.get("kv_channels") or a["hidden_size"] // n
    why = ("post-norm layers" if a.get("post_norm") else
           a["normalization"] if a["normalization"] != "LayerNorm" else
           "SwiGLU" if a.get("swiglu") else
           "no linear biases (--disable-bias-linear)" if not a.get("add_bias_linear", True) else
           f"grouped-query attention ({groups} groups of {n} heads) without rope" if groups != n else
           f"--kv-channels {kv} != hidden / heads" if kv * n != a["hidden_size"] else None)
    if why:
        raise CheckpointError(f"this model has {why}, which no HuggingFace family we convert to holds: "
                              f"{SHAPE}; {LLAMA_SHAPE}")


def _args(c):
    if c.activation_function not in ("gelu_new", "gelu", "gelu_pytorch_tanh"):
        raise CheckpointError(f"GPT-2 activation {c.activation_function!r} is not supported")
    if c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn or not c.scale_attn_weights:
        raise CheckpointError("GPT-2 attention-scaling variants are not supported")
    return dict(PRESET, num_layers=c.n_layer, hidden_size=c.n_embd, num_attention_heads=c.n_head,
                ffn_hidden_size=c.n_inner or 4 * c.n_embd, seq_length=c.n_positions,
                max_position_embeddings=c.n_positions, norm_epsilon=c.layer_norm_epsilon,
                openai_gelu=c.activation_function != "gelu", add_bias_linear=True,
                untie_embeddings_and_output_weights=not c.tie_word_embeddings, hidden_dropout=c.resid_pdrop,
                attention_dropout=c.attn_pdrop, vocab_size=c.vocab_size)


_BUFFERS = r"^h\.\d+\.attn\.(masked_)?bias$"  # causal-mask buffers older GPT-2 files carry
_LINEARS = (("self_attention.linear_proj", "attn.c_proj"), ("mlp.linear_fc1", "mlp.c_fc"),
            ("mlp.linear_fc2", "mlp.c_proj"))
_NORMS = (("input_layernorm", "ln_1"), ("pre_mlp_layernorm", "ln_2"))


def to_ours(config, sd):
    """GPT2LMHeadModel config and state dict -> (model args, {init_key: tensor})."""
    a = _args(config)
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
        for ours, hf in _NORMS:
            out[o + ours + ".weight"], out[o + ours + ".bias"] = sd[s + hf + ".weight"], sd[s + hf + ".bias"]
        for suffix, t in (("weight", sd[s + "attn.c_attn.weight"].t()), ("bias", sd[s + "attn.c_attn.bias"])):
            out[o + "self_attention.linear_qkv." + suffix] = qkv_to_ours(*t.split(h), n, n, h // n)
        for ours, hf in _LINEARS:
            out[o + ours + ".weight"] = sd[s + hf + ".weight"].t()
            out[o + ours + ".bias"] = sd[s + hf + ".bias"]
    sd.refuse_unused(ignore=_BUFFERS)
    return a, {k: v.contiguous() for k, v in out.items()}


def to_hf(a, t, buffers=None):
    """(model args, global tensors) -> (GPT2Config kwargs, GPT2LMHeadModel state dict)."""
    _check(a)
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
        for ours, hf in _NORMS:
            sd[s + hf + ".weight"], sd[s + hf + ".bias"] = t[o + ours + ".weight"], t[o + ours + ".bias"]
        sd[s + "attn.c_attn.weight"] = torch.cat(
            qkv_from_ours(t[o + "self_attention.linear_qkv.weight"], n, n, h // n)).t()
        sd[s + "attn.c_attn.bias"] = torch.cat(qkv_from_ours(t[o + "self_attention.linear_qkv.bias"], n, n, h // n))
        for ours, hf in _LINEARS:
            sd[s + hf + ".weight"] = t[o + ours + ".weight"].t()
            sd[s + hf + ".bias"] = t[o + ours + ".bias"]
    sd = {"transformer." + k: v.contiguous() for k, v in sd.items()}
    sd["lm_head.weight"] = t["output_layer.weight"].contiguous() if untied else sd["transformer.wte.weight"]
    t.refuse_unused()
    return cfg, sd


FAMILY = Family(
    name="gpt", title="GPT (GPT-2)", model_type="GPT",
    switches={"encoder": False, "attention": "standard", "qk_norm": False, "experts": False,
              "positions": "learned_absolute"},
    preset=PRESET, hf_model_type="gpt2", hf_config_class="GPT2Config", hf_model_class="GPT2LMHeadModel",
    hf_required_keys=("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"), to_ours=to_ours, to_hf=to_hf)
