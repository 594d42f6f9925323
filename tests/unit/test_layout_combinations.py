"""Feature combinations that are not built yet are refused by validate() with one line naming the
flags, before any group or model exists (the combinations that are built have parity tests)."""
import pytest
from test_config_resolve import _resolved

from megatron.core.config import ConfigError
from megatron.training.resolve import validate

MOE = ["--num-experts", "4", "--expert-model-parallel-size", "2"]


@pytest.mark.parametrize("strategy", ["no_shard", "optim", "optim_grads", "optim_grads_params"])
def test_expert_parallel_with_every_sharding_strategy_is_valid(strategy):
    model_cfg, train_cfg = _resolved(MOE + ["--data-parallel-sharding-strategy", strategy], world_size=2)
    assert validate(model_cfg, train_cfg, 2) == 2


def test_zb_v_on_nccl_is_refused_before_start_up():
    zb_v = ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-v", "--global-batch-size", "4"]
    model_cfg, train_cfg = _resolved(zb_v + ["--distributed-backend", "nccl"], world_size=2)
    with pytest.raises(ConfigError, match="zb-v runs on gloo"):
        validate(model_cfg, train_cfg, 2)
    model_cfg, train_cfg = _resolved(zb_v + ["--distributed-backend", "gloo"], world_size=2)
    assert validate(model_cfg, train_cfg, 2) == 1
