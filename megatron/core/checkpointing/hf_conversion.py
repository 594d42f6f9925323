"""What HuggingFace conversions share: our fused QKV regrouped, and Llama-style ends (embedding, final norm,
output layer). The family modules (megatron/core/models/families/) hold each family's names and config.

Pure tensor re-arrangement, no transformers import: tools/checkpoint/convert.py loads and saves the HF
model. Our fused QKV is [(heads + 2 groups) x d, h] ordered per query group: that group's q heads, then its
k head, then its v head (attention.py), so a TP split gives whole groups; HF keeps q, k, v apart (Llama) or
as [q_all; k_all; v_all] (GPT-2's c_attn). An untied output layer (output_layer.weight) is HF's lm_head with
tie_word_embeddings false. Every tensor of the source must be used (hf_checks.py).
"""
import torch

from .hf_checks import same_as_tied

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


def ends_to_ours(sd, untied):
    """Llama-style model.embed_tokens, model.norm and lm_head (a TrackedTensors) -> our tensors of the ends."""
    out = {"word_embeddings.weight": sd["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": sd["model.norm.weight"]}
    if untied:
        out["output_layer.weight"] = sd["lm_head.weight"]
    else:
        same_as_tied(sd, "lm_head.weight", "model.embed_tokens.weight")
    return out


def ends_from_ours(t, untied):
    """ends_to_ours' inverse: our tensors `t` -> model.embed_tokens, model.norm and lm_head (the embedding
    again when tied: the model ties it, and the saver leaves it out of the files)."""
    return {"model.embed_tokens.weight": t["word_embeddings.weight"],
            "model.norm.weight": t["decoder.final_layernorm.weight"],
            "lm_head.weight": t["output_layer.weight" if untied else "word_embeddings.weight"]}
