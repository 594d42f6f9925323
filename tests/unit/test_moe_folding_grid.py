"""MoE parallel folding in one process: the folded expert grid's rank lists (and that at expert TP =
TP it is the unfolded grid), which copy of an expert's parameter counts once, and what folding
refuses. The CLI parity is tests/functional/test_moe_folding.py."""
import pytest
import torch

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.parallel_state import (
    ParallelConfigError,
    ProcessGroups,
    expert_grid_rank_lists,
    expert_rank_lists,
    validate_expert_parallel_size,
)
from megatron.core.tensor_parallel.param_meta import counted_once, set_expert_parallel, tensor_parallel_split


def test_folded_rank_lists():
    g = expert_grid_rank_lists(tp=2, cp=1, dp=1, pp=1, etp=1, ep=2)  # EP over the two TP ranks
    assert (g["etp"], g["ep"], g["edp"], g["tp_cp"]) == ([[0], [1]], [[0, 1]], [[0], [1]], [[0, 1]])
    g = expert_grid_rank_lists(tp=2, cp=1, dp=2, pp=1, etp=1, ep=4)  # one EP group over TP x DP
    assert (g["ep"], g["edp"], g["tp_cp"]) == ([[0, 1, 2, 3]], [[0], [1], [2], [3]], [[0, 1], [2, 3]])
    g = expert_grid_rank_lists(tp=2, cp=1, dp=2, pp=1, etp=1, ep=2)
    assert (g["ep"], g["edp"]) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    g = expert_grid_rank_lists(tp=4, cp=1, dp=1, pp=1, etp=2, ep=2)  # expert TP 2 inside TP 4
    assert (g["etp"], g["ep"], g["edp"]) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0], [1], [2], [3]])
    g = expert_grid_rank_lists(tp=2, cp=2, dp=1, pp=2, etp=1, ep=2)  # per stage; TP x CP share the sequences
    assert g["ep"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and g["tp_cp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("tp,cp,dp,pp,etp,ep", [(2, 1, 4, 1, 1, 2), (4, 2, 1, 2, 2, 2), (2, 2, 2, 1, 2, 4),
                                                 (1, 1, 4, 2, 1, 4)])
def test_every_rank_once_and_expert_tp_equal_to_tp_is_the_unfolded_grid(tp, cp, dp, pp, etp, ep):
    g = expert_grid_rank_lists(tp, cp, dp, pp, etp, ep)
    world = tp * cp * dp * pp
    for kind in ("etp", "ep", "edp", "tp_cp"):
        assert sorted(r for ranks in g[kind] for r in ranks) == list(range(world)), kind
    assert {len(r) for r in g["edp"]} == {tp * cp * dp // (etp * ep)}
    same = expert_grid_rank_lists(tp, cp, dp, pp, tp, 2)  # existing rank assignments unchanged at ETP = TP
    ep_lists, edp_lists = expert_rank_lists(tp, dp * cp, pp, 2)
    assert sorted(same["ep"]) == sorted(ep_lists) and sorted(same["edp"]) == sorted(edp_lists)


def test_sizes_that_do_not_fold_are_refused():
    validate_expert_parallel_size(2, 4, tp=2, etp=1)
    with pytest.raises(ParallelConfigError, match="--expert-tensor-parallel-size"):
        validate_expert_parallel_size(1, 4, tp=2, etp=1)


def _groups(folded, tp_rank):
    return ProcessGroups(*[None] * 5, tp_size=2, dp_size=1, pp_size=1, tp_rank=tp_rank, dp_rank=0, pp_rank=0, rank=0,
                         world_size=2, pp_ranks=[0], ep_size=2 if folded else 1, expert_folded=folded)


def test_an_expert_parameter_counts_on_every_rank_of_the_folded_grid():
    expert, dense = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    set_expert_parallel(expert)
    folded = _groups(True, 1)  # TP rank 1 at expert TP 1: its own experts, not a TP copy
    assert counted_once(expert, folded) and not counted_once(dense, folded)
    assert tensor_parallel_split(expert, folded) == (0, 1) and tensor_parallel_split(dense, folded) == (1, 2)
    plain = _groups(False, 1)  # unfolded: the experts' TP split is TP's
    assert tensor_parallel_split(expert, plain) == (1, 2)
    assert "experts folded over expert-TP 1 x EP 2" in folded.describe()


def _cfg(**kw):
    base = dict(num_layers=2, hidden_size=16, num_attention_heads=2, num_experts=4, seq_length=64,
                add_bias_linear=False, attention_dropout=0.0, tensor_model_parallel_size=2,
                expert_tensor_parallel_size=1)
    return TransformerConfig(**{**base, **kw})


def test_folding_refuses_what_it_does_not_build():
    _cfg().validate()
    _cfg(add_bias_linear=True).validate()  # expert TP 1: whole experts, biases fine
    _cfg(moe_expert_capacity_factor=1.0).validate()  # the drops are one process's (capacity.py)
    with pytest.raises(ConfigError, match="--seq-length"):
        _cfg(seq_length=63).validate()
    _cfg(expert_tensor_parallel_size=4).validate()  # above TP: expert-TP groups span DP ranks
    with pytest.raises(ConfigError, match="--expert-tensor-parallel-size 3 must divide the experts' hidden size"):
        _cfg(expert_tensor_parallel_size=3).validate()
    with pytest.raises(ConfigError, match="--expert-tensor-parallel-size .0. must be positive"):
        _cfg(expert_tensor_parallel_size=0).validate()
