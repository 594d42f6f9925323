"""The planner's ZeRO-3, context-parallel and expert-parallel bytes against their closed forms."""
import pytest

from megatron.training.planner.cost import dp_traffic
from megatron.training.planner.predict import configs, estimator

BASE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64", "--vocab-size", "128", "--bf16"]


@pytest.mark.parametrize("recompute", [None, "full"])
def test_zero3_dp_bytes_equal_formula(recompute):
    """ZeRO-3 per step: 3 P (d-1)/d, plus 2 P (d-1)/d per further microbatch (one more gather per
    microbatch under full recompute); P the full parameter bytes, the gradients fp32 (docs/zero.md)."""
    d, micro = 4, 3
    flags = BASE + ["--global-batch-size", str(d * micro), "--micro-batch-size", "1",
                    "--use-distributed-optimizer", "--data-parallel-sharding-strategy", "optim_grads_params"]
    flags += ["--recompute-granularity", recompute] if recompute else []
    c, t = configs(flags, d)
    mem = estimator().estimate(c, t, d)
    params = mem["params"] * d  # the estimator holds the shard; its buffers are padded to d
    traffic = dp_traffic(mem, d, True, "optim_grads_params", micro, recompute == "full")
    gathers = (3 if recompute else 2) * micro
    assert traffic["dp-params"] == gathers * params * (d - 1) / d
    assert traffic["dp-grads"] == 2 * params * (d - 1) / d  # fp32 grads: twice the bf16 parameter bytes
    if not recompute:  # the docs' figure, in elements: 3 P (d-1)/d for the first microbatch, 2 per further one
        elements = traffic["dp-params"] / 2 + traffic["dp-grads"] / 4
        assert elements == (3 + 2 * (micro - 1)) * params / 2 * (d - 1) / d
