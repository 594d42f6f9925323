"""Global grad norm and clipping at TP 2 against one process; AdamW parameter groups."""
import dataclasses

import pytest
import torch
import torch.distributed as dist

from megatron.core.config import TransformerConfig
from megatron.core.distributed import finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import clip_grads_, get_grad_norm
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.random import model_parallel_seed
from tests.harness import spawn


def _grad_norms(groups, sp):
    torch.manual_seed(0)
    ids = torch.randint(0, 200, (2, 16))
    singles = [dist.new_group([k]) for k in range(groups.world_size)]
    plan = ParallelLayout(1).plan_groups(0)  # one process, each of its groups this rank's own 1-rank group
    one = dataclasses.replace(plan, **{n: singles[groups.rank] for n in plan.NAMES if getattr(plan, n) is not None})
    out = []
    for g, tp, seq_par in ((groups, groups.tp_size, sp), (one, 1, False)):
        cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16,
                                vocab_size=200, hidden_dropout=0.0, attention_dropout=0.0,
                                tensor_model_parallel_size=tp, sequence_parallel=seq_par)
        model_parallel_seed(3, g.tp_rank, 0, "cpu")
        model = GPTModel(cfg, g)
        initialize_parameters(model, 3, g.tp_rank, tp)
        model(ids, ids).mean().backward()
        finalize_model_grads(model, g)
        params = list(model.parameters())
        norm = get_grad_norm(params, g)
        clip_grads_(params, 0.5 * float(norm), norm)
        out.append((float(norm), float(get_grad_norm(params, g))))
    return out


@pytest.mark.parametrize("sp", [False, True])
def test_grad_norm_counts_replicated_params_once(sp):
    for (tp_norm, tp_clipped), (ref_norm, ref_clipped) in spawn(2, _grad_norms, sp, tp=2):
        assert tp_norm == pytest.approx(ref_norm, rel=1e-5)
        assert tp_clipped == pytest.approx(0.5 * ref_norm, rel=1e-4)
        assert ref_clipped == pytest.approx(0.5 * ref_norm, rel=1e-4)


def _groups_of(groups):
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import MegatronOptimizer
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = MegatronOptimizer(DistributedDataParallel(model, groups), groups, 1e-3, 0.1)
    return [(g["weight_decay"], sorted(p.numel() for p in g["params"])) for g in opt.param_groups]


def test_no_weight_decay_on_biases_and_norms():
    [got] = spawn(1, _groups_of)
    assert got == [(0.1, [16]), (0.0, [4, 4, 4])]  # linear weight; linear bias, norm weight and bias
