"""MoE with context parallelism in one process: each CP rank's router losses are its part of the
micro-batch's (the parts add up, and so do their gradients), the expert groups are carved out of
DP x CP, and the layout line names EP. The CLI parity is tests/functional/test_moe_parity.py."""
import pytest
import torch

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.transformer.moe import aux_losses


def _routing(T=12, E=4, k=2):
    torch.manual_seed(0)
    logits = torch.randn(T, E, dtype=torch.float64, requires_grad=True)
    indices = torch.topk(logits.detach(), k, dim=-1).indices
    return logits, indices, torch.bincount(indices.reshape(-1), minlength=E).double()


def test_switch_and_z_loss_parts_add_up_to_the_whole():
    logits, indices, counts = _routing()
    whole = aux_losses.switch_load_balancing_loss(logits.softmax(-1), counts, 2, 1e-2) + aux_losses.z_loss(logits, 1e-3)
    (g_whole,) = torch.autograd.grad(whole, logits)
    parts = [aux_losses.switch_load_balancing_loss(rows.softmax(-1), counts, 2, 1e-2, total_tokens=12)
             + aux_losses.z_loss(rows, 1e-3, parts=2) for rows in (logits[[0, 1, 2, 9, 10, 11]], logits[3:9])]
    (g_parts,) = torch.autograd.grad(sum(parts), logits)
    torch.testing.assert_close(sum(parts), whole, rtol=1e-12, atol=0)
    torch.testing.assert_close(g_parts, g_whole, rtol=1e-12, atol=0)


def test_expert_groups_are_carved_out_of_dp_x_cp():
    layout = ParallelLayout(8, tp=2, cp=2, ep=2)  # DP 2
    assert sorted(layout.rank_lists("ep")) == [[0, 2], [1, 3], [4, 6], [5, 7]]  # EP2 pairs the CP ranks of one DP rank
    assert sorted(layout.rank_lists("edp")) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    p = layout.position(7)  # the same rank order as the dense grid
    assert (p.tp, p.cp, p.dp, p.ep, p.edp) == (1, 1, 1, 1, 1)


def test_describe_names_context_and_expert_parallelism():
    g = ParallelLayout(4, cp=2, ep=2).plan_groups(0)
    assert "CP 2" in g.describe() and "EP 2" in g.describe()


def test_a_sequence_the_cp_ranks_would_pad_is_refused_with_moe():
    def moe(seq):
        return TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, num_experts=4, seq_length=seq,
                                 add_bias_linear=False, attention_dropout=0.0, context_parallel_size=2)
    moe(64).validate()
    with pytest.raises(ConfigError, match="--seq-length"):
        moe(62).validate()


def test_a_capacity_factor_is_accepted_with_context_parallelism():  # the drops are one process's: capacity.py
    cfg = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, num_experts=4, seq_length=64,
                            add_bias_linear=False, attention_dropout=0.0, context_parallel_size=2,
                            moe_expert_capacity_factor=1.0)
    cfg.validate()
