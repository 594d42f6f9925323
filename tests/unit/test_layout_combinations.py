"""Feature combinations that are not built yet are refused by validate() with one line naming the
flags, before any group or model exists (the combinations that are built have parity tests)."""
import pytest
from test_config_resolve import _resolved

from megatron.training.config.resolve import validate

MOE = ["--num-experts", "4", "--expert-model-parallel-size", "2"]


@pytest.mark.parametrize("strategy", ["no_shard", "optim", "optim_grads", "optim_grads_params"])
def test_expert_parallel_with_every_sharding_strategy_is_valid(strategy):
    model_cfg, train_cfg = _resolved(MOE + ["--data-parallel-sharding-strategy", strategy], world_size=2)
    assert validate(model_cfg, train_cfg, 2).dp == 2


@pytest.mark.parametrize("extra", [["--distributed-backend", "nccl"], ["--distributed-backend", "gloo"],
                                   ["--use-distributed-optimizer", "--overlap-grad-reduce"],
                                   ["--data-parallel-sharding-strategy", "optim_grads", "--overlap-grad-reduce"]])
def test_zb_v_is_valid_on_nccl_and_with_the_distributed_optimizer_overlapped(extra):
    # its gradients have their own pipeline group (groups.pp_grad), not a gloo tag; its tied copies on
    # rank 0 are summed before their buckets' reduction (ddp.tied_reduced_last)
    zb_v = ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-v", "--global-batch-size", "4"]
    model_cfg, train_cfg = _resolved(zb_v + extra, world_size=4)
    assert validate(model_cfg, train_cfg, 4).dp == 2
