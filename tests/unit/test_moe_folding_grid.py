"""MoE parallel folding in one process: the folded expert grid's rank lists (and that at expert TP =
TP it is the unfolded grid), which copy of an expert's parameter counts once, and what folding
refuses. The CLI parity is tests/functional/test_moe_folding.py."""
import pytest
import torch

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.parallel_state import ParallelConfigError
from megatron.core.tensor_parallel.param_meta import counted_once, set_expert_parallel, tensor_parallel_split


def expert_grid_rank_lists(tp, cp, dp, pp, etp, ep):
    layout = ParallelLayout(tp * cp * dp * pp, tp=tp, cp=cp, pp=pp, etp=etp, ep=ep)
    return {k: layout.rank_lists(k) for k in ("etp", "ep", "edp", "tp_cp")}


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
    same = ParallelLayout(world, tp=tp, cp=cp, pp=pp, etp=tp, ep=2)  # at ETP = TP: the unfolded grid
    assert not same.experts_folded and same.edp == dp * cp // 2
    for kind in ("ep", "edp"):  # EP consecutive DP x CP ranks (CP fastest) hold different experts
        for ranks in same.rank_lists(kind):
            i = [same.position(r) for r in ranks]
            assert len({(p.tp, p.pp) for p in i}) == 1, kind
            j = [p.cp + cp * p.dp for p in i]
            assert j == (list(range(j[0], j[0] + 2)) if kind == "ep" else list(range(j[0], dp * cp, 2))), kind


def test_sizes_that_do_not_fold_are_refused():
    ParallelLayout(4, tp=2, etp=1, ep=4)
    with pytest.raises(ParallelConfigError, match="--expert-tensor-parallel-size"):
        ParallelLayout(2, tp=2, etp=1, ep=4)


def _groups(folded, tp_rank):
    return ParallelLayout(2, tp=2, etp=1 if folded else None, ep=2 if folded else 1).plan_groups(tp_rank)


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
