"""The planner's data-parallel bytes per collective equal what a real gloo run sends
(debug.count_traffic over one training step of the same tiny layout): TP2 x DP2 with and
without the distributed optimizer, so that both the TP-sharded buffers and both DP paths count."""
import torch

from megatron.core import debug
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.planner.cost import dp_traffic
from megatron.training.planner.predict import configs, estimator
from megatron.training.training import setup_model_and_optimizer, train_step
from tests.distributed.test_data_parallel import _batches, _step
from tests.harness import spawn

# _batches gives 2 microbatches of 2 x 16 tokens per DP rank
TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--vocab-size", "256", "--micro-batch-size", "2",
        "--global-batch-size", "8", "--tensor-model-parallel-size", "2", "--ddp-bucket-size", "5000",
        "--hidden-dropout", "0", "--attention-dropout", "0"]


def _run(groups):
    out = []
    for extra in ([], ["--use-distributed-optimizer"]):
        c, t = configs(TINY + extra, 4)
        model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
        model, ddp, opt, sched = setup_model_and_optimizer(
            c, t, groups, torch.device("cpu"), lambda c_, g, d, **kw: GPTModel(c_, g, device=d, **kw))
        with debug.count_traffic() as sent:
            train_step(model, ddp, opt, sched, _batches(groups), _step, groups, 1)
        mem = estimator().estimate(c, t, 4, groups.pp_rank)
        out.append((extra, dict(sent), dp_traffic(mem, groups.dp_size, t.use_distributed_optimizer)))
    return out


def test_dp_bytes_per_collective_equal_the_counted_traffic():
    for per_rank in spawn(4, _run, tp=2):  # one spawn for both runs: process start-up is the cost here
        for extra, counted, predicted in per_rank:
            assert counted == predicted, (extra, counted, predicted)
