"""BERT (pretrain_bert.py's model): HuggingFace BertForPreTraining, or BertForMaskedLM without a binary head
(--bert-no-binary-head), which has no pooler. HF's BERT is post-norm with a LayerNorm on the embeddings:
only a model trained with --post-norm converts.
"""
from ...checkpointing.hf_checks import TrackedTensors, same_as_tied
from ...checkpointing.hf_conversion import L, qkv_from_ours, qkv_to_ours
from ...errors import CheckpointError
from .family import Family

_ACTS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}  # HF name -> our openai_gelu

# (ours, HF) name pairs, weight and bias each
_EMBEDDING_NORM = ("embedding_layernorm", "bert.embeddings.LayerNorm")
_LAYER = (("self_attention.linear_proj", "attention.output.dense"),
          ("post_attention_layernorm", "attention.output.LayerNorm"),
          ("mlp.linear_fc1", "intermediate.dense"),
          ("mlp.linear_fc2", "output.dense"),
          ("post_mlp_layernorm", "output.LayerNorm"))
_LM_HEAD = (("lm_head.dense", "cls.predictions.transform.dense"),
            ("lm_head.layernorm", "cls.predictions.transform.LayerNorm"))
_BINARY = (("pooler", "bert.pooler.dense"), ("binary_head", "cls.seq_relationship"))


def _pairs(pairs, ours_prefix="", hf_prefix=""):
    for ours, hf in pairs:
        for x in ("weight", "bias"):
            yield f"{ours_prefix}{ours}.{x}", f"{hf_prefix}{hf}.{x}"


def _bert_args(c):
    if c.hidden_act not in _ACTS:
        raise CheckpointError(f"BERT activation {c.hidden_act!r} is not supported ({', '.join(_ACTS)})")
    if getattr(c, "position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"BERT position embedding {c.position_embedding_type!r} is not supported (absolute)")
    if c.type_vocab_size != 2:
        raise CheckpointError(f"BERT with {c.type_vocab_size} token types is not supported (2)")
    return dict(num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                ffn_hidden_size=c.intermediate_size, seq_length=c.max_position_embeddings,
                max_position_embeddings=c.max_position_embeddings, position_embedding_type="learned_absolute",
                normalization="LayerNorm", norm_epsilon=c.layer_norm_eps, post_norm=True, swiglu=False,
                openai_gelu=_ACTS[c.hidden_act], add_bias_linear=True, untie_embeddings_and_output_weights=False,
                hidden_dropout=c.hidden_dropout_prob, attention_dropout=c.attention_probs_dropout_prob,
                vocab_size=c.vocab_size)


def to_ours(config, sd):
    """BertForPreTraining (or BertForMaskedLM) config and state dict -> (model args, {init_key: tensor})."""
    a = _bert_args(config)
    sd = TrackedTensors(sd, "the HuggingFace checkpoint")
    h, n = a["hidden_size"], a["num_attention_heads"]
    e = "bert.embeddings."
    same_as_tied(sd, "cls.predictions.decoder.weight", e + "word_embeddings.weight")
    same_as_tied(sd, "cls.predictions.decoder.bias", "cls.predictions.bias")
    out = {"word_embeddings.weight": sd[e + "word_embeddings.weight"],
           "position_embeddings": sd[e + "position_embeddings.weight"],
           "tokentype_embeddings": sd[e + "token_type_embeddings.weight"],
           "lm_head.bias": sd["cls.predictions.bias"]}
    pairs = [_EMBEDDING_NORM, *_LM_HEAD] + (list(_BINARY) if "bert.pooler.dense.weight" in sd else [])
    for ours, hf in _pairs(pairs):
        out[ours] = sd[hf]
    for i in range(a["num_layers"]):
        s, o = f"bert.encoder.layer.{i}.", L.format(i)
        for ours, hf in _pairs(_LAYER, o, s):
            out[ours] = sd[hf]
        for x in ("weight", "bias"):
            q, k, v = (sd[f"{s}attention.self.{p}.{x}"] for p in ("query", "key", "value"))
            out[f"{o}self_attention.linear_qkv.{x}"] = qkv_to_ours(q, k, v, n, n, h // n)
    sd.refuse_unused(ignore=r"^bert\.embeddings\.(position_ids|token_type_ids)$")  # buffers
    return a, {key: t.contiguous() for key, t in out.items()}


def to_hf(a, t, buffers=None):
    """(model args, global tensors) -> (BertConfig kwargs, state dict): BertForPreTraining's with a binary
    head, else BertForMaskedLM's (_model_class)."""
    if not a.get("post_norm"):
        raise CheckpointError("HuggingFace BERT is post-norm: only a model trained with --post-norm converts "
                              "(this one has pre-norm layers and a final norm)")
    if a.get("swiglu") or a.get("normalization") != "LayerNorm" or not a.get("add_bias_linear") \
            or a.get("num_query_groups", a["num_attention_heads"]) != a["num_attention_heads"]:
        raise CheckpointError("HuggingFace BERT needs GeLU, LayerNorm, linear biases and no grouped-query attention")
    t = TrackedTensors(t, "the checkpoint")
    h, n = a["hidden_size"], a["num_attention_heads"]
    binary = "pooler.weight" in t
    cfg = dict(vocab_size=a["vocab_size"], hidden_size=h, num_hidden_layers=a["num_layers"], num_attention_heads=n,
               intermediate_size=a["ffn_hidden_size"], hidden_act="gelu_new" if a.get("openai_gelu") else "gelu",
               max_position_embeddings=a["max_position_embeddings"], type_vocab_size=2,
               layer_norm_eps=a["norm_epsilon"], hidden_dropout_prob=a["hidden_dropout"],
               attention_probs_dropout_prob=a["attention_dropout"], tie_word_embeddings=True)
    e = "bert.embeddings."
    sd = {e + "word_embeddings.weight": t["word_embeddings.weight"],
          e + "position_embeddings.weight": t["position_embeddings"],
          e + "token_type_embeddings.weight": t["tokentype_embeddings"],
          "cls.predictions.bias": t["lm_head.bias"], "cls.predictions.decoder.bias": t["lm_head.bias"],
          "cls.predictions.decoder.weight": t["word_embeddings.weight"]}
    for ours, hf in _pairs([_EMBEDDING_NORM, *_LM_HEAD] + (list(_BINARY) if binary else [])):
        sd[hf] = t[ours]
    for i in range(a["num_layers"]):
        s, o = f"bert.encoder.layer.{i}.", L.format(i)
        for ours, hf in _pairs(_LAYER, o, s):
            sd[hf] = t[ours]
        for x in ("weight", "bias"):
            for p, w in zip(("query", "key", "value"),
                            qkv_from_ours(t[f"{o}self_attention.linear_qkv.{x}"], n, n, h // n)):
                sd[f"{s}attention.self.{p}.{x}"] = w
    t.refuse_unused()
    return cfg, {k: v.contiguous() for k, v in sd.items()}


def _model_class(sd):
    return "BertForPreTraining" if "bert.pooler.dense.weight" in sd else "BertForMaskedLM"


FAMILY = Family(
    name="bert", title="BERT", model_type="BERT", switches={"encoder": True},
    preset={"post_norm": True, "normalization": "LayerNorm", "position_embedding_type": "learned_absolute"},
    hf_model_type="bert", hf_config_class="BertConfig", hf_model_class=_model_class,
    hf_required_keys=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                      "max_position_embeddings"),
    to_ours=to_ours, to_hf=to_hf, hf_tied=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"))
