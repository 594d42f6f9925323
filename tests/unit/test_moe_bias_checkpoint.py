"""The MoE expert bias in a checkpoint, one process: written once per layer whatever the layout,
read back whole, a checkpoint without it starts it at 0 with a warning, and a checkpoint holding
it is refused by a model without it. (Through the CLI: test_moe_parity's checkpoint test.)"""

import pytest
import torch
from torch import nn

from megatron.core.checkpointing import CheckpointError, find_checkpoint, open_reader
from megatron.core.checkpointing.storage import save_global_checkpoint
from megatron.core.config import TransformerConfig
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.param_meta import set_init_key
from megatron.core.transformer.moe.router import TopKRouter
from megatron.training.checkpointing import model_state as cms

KEYS = [f"decoder.layers.{i}.mlp.router.expert_bias" for i in (0, 1)]


def routers(bias=True):
    config = TransformerConfig(num_layers=2, hidden_size=8, num_attention_heads=2, num_experts=4,
                               moe_ffn_hidden_size=8, moe_router_enable_expert_bias=bias)
    model = nn.ModuleList(TopKRouter(config, i + 1) for i in range(2))
    for i, r in enumerate(model):
        set_init_key(r.weight, f"decoder.layers.{i}.mlp.router.weight")
    return model


def grid(tp_rank=0, dp_rank=0, cp_rank=0):
    """The rank at (tp_rank, cp_rank, dp_rank) of TP2 x CP2 x DP2 (stand-in groups: no communication)."""
    return ParallelLayout(8, tp=2, cp=2).plan_groups(tp_rank + 2 * (cp_rank + 2 * dp_rank))


def saved(tmp_path, pieces):
    save_global_checkpoint(str(tmp_path), pieces, {"model": {}, "training": {}})
    return open_reader(find_checkpoint(str(tmp_path)))


def test_bias_written_once_and_read_back(tmp_path):
    model = routers()
    for i, r in enumerate(model):
        r.expert_bias.copy_(torch.tensor([0.05, -0.05, 0.1, -0.1]) * (i + 1))
    assert cms.model_state_keys(model) == KEYS
    for other in (grid(tp_rank=1), grid(dp_rank=1), grid(cp_rank=1)):  # replicas of the writer write nothing
        assert cms.model_state_pieces(model, other) == []
    pieces = cms.model_state_pieces(model, grid())
    assert [(p["key"], p["state"]) for p in pieces] == [(k, cms.BUFFER) for k in KEYS]
    reader = saved(tmp_path, pieces)
    fresh = routers()
    missing = cms.missing_model_state(reader, [cms.model_state_keys(fresh)])
    assert missing == []
    cms.load_model_state(reader, fresh, grid(tp_rank=1), missing)  # any TP rank reads it whole
    for a, b in zip(model, fresh):
        assert torch.equal(a.expert_bias, b.expert_bias)


def test_checkpoint_without_bias_starts_it_at_zero_with_a_warning(tmp_path, monkeypatch):
    reader = saved(tmp_path, [])
    model = routers()
    missing = cms.missing_model_state(reader, [cms.model_state_keys(model)])
    assert missing == KEYS
    said = []
    monkeypatch.setattr(cms, "print_rank_0", said.append)
    cms.load_model_state(reader, model, grid(), missing)
    assert len(said) == 1 and "warning" in said[0] and "starts at 0" in said[0]
    assert all(not r.expert_bias.any() for r in model)


def test_checkpoint_with_bias_refused_without_the_flag(tmp_path):
    reader = saved(tmp_path, cms.model_state_pieces(routers(), grid()))
    plain = routers(bias=False)
    assert cms.model_state_keys(plain) == []
    with pytest.raises(CheckpointError, match="--moe-router-enable-expert-bias") as e:
        cms.missing_model_state(reader, [cms.model_state_keys(plain)])
    assert "\n" not in str(e.value)
