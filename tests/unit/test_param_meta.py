"""Every parameter of the models has a ParamMeta, and the counted-once and weight-decay rules
read it (one process, no process group: ParallelLayout.plan_groups' stand-ins)."""
import dataclasses
import functools

import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.models.bert import BertModel
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.param_meta import (
    ParamMeta,
    counted_once,
    has_weight_decay,
    param_meta,
    set_sequence_parallel,
)


def _config(**kw):
    cfg = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, vocab_size=50,
                            hidden_dropout=0.0, attention_dropout=0.0, **kw)
    cfg.validate()
    return cfg


def _groups(tp_rank=0, pp_rank=0, pp_size=1):
    tp, pp = (2 if tp_rank else 1), max(pp_size, pp_rank + 1)
    return ParallelLayout(tp * pp, tp=tp, pp=pp).plan_groups(tp_rank + tp * pp_rank)


@functools.cache
def _models():
    return {"gpt": GPTModel(_config(), _groups(), device="meta"),
            "gpt-untied": GPTModel(_config(untie_embeddings_and_output_weights=True, add_bias_linear=True),
                                   _groups(), device="meta"),
            "bert": BertModel(_config(position_embedding_type="learned_absolute"), _groups(), device="meta")}


@pytest.mark.parametrize("which", ["gpt", "gpt-untied", "bert"])
def test_every_parameter_has_a_meta_with_its_init_key(which):
    model = _models()[which]
    keys = [param_meta(p).init_key for p in model.parameters()]
    assert all(isinstance(k, str) for k in keys) and len(set(keys)) == len(keys)
    for name, p in model.named_parameters():
        meta = param_meta(p)
        assert isinstance(meta, ParamMeta)
        assert meta.init_method in ("normal", "zeros", "ones"), name
        assert (meta.init_std is not None) == (meta.init_method == "normal"), name
        if meta.tensor_parallel:
            assert meta.partition_dim in (0, 1), name
        assert not meta.tied_embedding  # one pipeline stage holds the only copy


@pytest.mark.parametrize("which", ["gpt", "gpt-untied", "bert"])
def test_no_weight_decay_for_biases_and_norms(which):
    for name, p in _models()[which].named_parameters():
        flat = name.endswith("bias") or "norm" in name
        assert has_weight_decay(p) is not flat, name
        assert param_meta(p).no_weight_decay is flat, name


def test_tensor_parallel_marks():
    params = {param_meta(p).init_key: p for p in _models()["gpt-untied"].parameters()}  # checkpoint keys
    qkv = param_meta(params["decoder.layers.0.self_attention.linear_qkv.weight"])
    assert (qkv.tensor_parallel, qkv.partition_dim, qkv.partition_stride) == (True, 0, 1)
    proj = param_meta(params["decoder.layers.0.self_attention.linear_proj.weight"])
    assert (proj.tensor_parallel, proj.partition_dim) == (True, 1)
    assert not param_meta(params["decoder.layers.0.self_attention.linear_proj.bias"]).tensor_parallel
    for key in ("word_embeddings.weight", "output_layer.weight"):
        meta = param_meta(params[key])
        assert (meta.tensor_parallel, meta.partition_dim, meta.unpadded_size) == (True, 0, 50)


def test_sequence_parallel_marks_replicated_params_only():
    model = GPTModel(_config(sequence_parallel=True, add_bias_linear=True, position_embedding_type="learned_absolute"),
                     _groups(), device="meta")
    for name, p in model.named_parameters():
        meta = param_meta(p)
        # the position table is scattered to the sequence shards after the lookup: its grad is whole
        partial = not meta.tensor_parallel and meta.init_key != "position_embeddings"
        assert meta.sequence_parallel == partial, name


def test_counted_once_rules():
    cfg = _config(pipeline_model_parallel_size=2)
    first = GPTModel(cfg, _groups(pp_rank=0, pp_size=2), pre_process=True, post_process=False, device="meta")
    last = GPTModel(cfg, _groups(pp_rank=1, pp_size=2), pre_process=False, post_process=True, device="meta")
    tied_first, tied_last = first.word_embeddings.weight, last.word_embeddings.weight
    assert param_meta(tied_first).tied_embedding and param_meta(tied_last).tied_embedding
    assert param_meta(tied_first).init_key == param_meta(tied_last).init_key
    assert counted_once(tied_first, _groups(pp_rank=0)) and not counted_once(tied_last, _groups(pp_rank=1))
    norm = last.decoder.final_layernorm.weight
    split = last.decoder.layers[0].self_attention.linear_qkv.weight
    assert counted_once(norm, _groups(tp_rank=0, pp_rank=1)) and not counted_once(norm, _groups(tp_rank=1))
    assert counted_once(split, _groups(tp_rank=1, pp_rank=1))  # each TP rank holds another shard


def test_unmarked_parameter_gets_the_default_and_marks_do_not_leak():
    w, b = torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(3))
    assert param_meta(w) == ParamMeta() and has_weight_decay(w)
    assert not has_weight_decay(b)
    set_sequence_parallel(b)
    assert param_meta(b).sequence_parallel and not param_meta(w).sequence_parallel
    with pytest.raises(dataclasses.FrozenInstanceError):
        param_meta(b).sequence_parallel = False  # records are changed through the set_* functions only
