"""The planner's bytes for Muon's optimizer step equal what a real gloo step sends, at TP2 x DP2: the TP
mode's collectives (duplicated: each split matrix's fp32 gather; distributed: its norm and Gram matrices)
and the distributed optimizer's owner exchange (momentum to the owners, updates back), and the owners
balance the Newton-Schulz FLOPs over the DP ranks."""
import pytest
import torch

from megatron.core import debug
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer.muon_owners import balance
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from megatron.training.planner.memory import estimate
from megatron.training.planner.muon_cost import muon_traffic
from megatron.training.planner.predict import configs
from tests.distributed.test_data_parallel import _batches, _step
from tests.distributed.test_planner_traffic import TINY
from tests.harness import spawn

MUON = ["--optimizer", "muon", "--swiglu", "--group-query-attention", "--num-query-groups", "2"]
VARIANTS = (["--use-distributed-optimizer"], ["--muon-tp-mode", "distributed"],
            ["--muon-tp-mode", "distributed", "--data-parallel-sharding-strategy", "optim_grads_params"])


def _run(groups):
    out = []
    for extra in VARIANTS:
        c, t = configs(TINY + MUON + extra, 4)
        model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
        model, ddp, opt, sched = setup_model_and_optimizer(
            c, t, groups, torch.device("cpu"), lambda c_, g, d, **kw: GPTModel(c_, g, device=d, **kw))
        with debug.count_traffic() as sent:
            train_step(model, ddp, opt, sched, _batches(groups), _step, groups, 1)
        muon = {k: v for k, v in sent.items() if k.startswith("muon")}
        predicted = muon_traffic(t.muon_config(), estimate(c, t, 4)["muon"], on_gpu=False)
        out.append((extra, groups.dp_rank, muon, predicted))
    return out


def test_muon_bytes_equal_the_counted_traffic():
    for per_rank in spawn(4, _run, tp=2):
        for extra, dp_rank, counted, predicted in per_rank:
            if dp_rank == 0:  # the estimate is a DP rank 0's (its TP peers send the same)
                assert counted.keys() == predicted.keys() and counted, (extra, counted, predicted)
                for tag in counted:
                    assert counted[tag] == pytest.approx(predicted[tag], rel=1e-12), (extra, tag, counted, predicted)


def test_owners_balance_the_newton_schulz_flops():
    costs = [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    owners = balance(costs, [[1, 0]] * len(costs), 2)
    loads = [sum(c for c, o in zip(costs, owners) if o == r) for r in range(2)]
    assert loads == [18.0, 18.0]
    # equal costs: the rank holding more of a matrix owns it
    assert balance([1.0, 1.0], [[0, 5], [5, 0]], 2) == [1, 0]
