"""ZeRO-3 with MoE expert parallelism on real gloo processes: the expert buffers are sharded and
gathered over the expert-data-parallel group, the dense ones over DP; bytes sent and held per step
against theory."""
import torch

from megatron.core import comm, debug, parallel_state
from megatron.core.config import TransformerConfig
from megatron.core.distributed.sharded_buffer import is_allocated
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.config import TrainingConfig
from megatron.training.training import setup_model_and_optimizer, train_step
from tests.harness import spawn

from .test_data_parallel import _batches, _step


def _zero3_moe(groups):
    groups = parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=2)
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=256,
                            hidden_dropout=0.0, attention_dropout=0.0, num_experts=4, moe_ffn_hidden_size=24,
                            add_bias_linear=False, expert_model_parallel_size=2)
    t = TrainingConfig(micro_batch_size=2, global_batch_size=2 * groups.dp_size, train_iters=10, lr=1e-3,
                       lr_warmup_iters=0, mock_data=True, tokenizer_type="NullTokenizer", null_vocab_size=256,
                       data_parallel_sharding_strategy="optim_grads_params")
    t.resolve_sharding()
    t.validate(groups.dp_size)
    model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
    model, ddp, opt, sched = setup_model_and_optimizer(cfg, t, groups, torch.device("cpu"),
                                                       lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))
    for step in (1, 2):  # the first step also takes the shards from the initial values
        with debug.count_traffic() as sent:
            train_step(model, ddp, opt, sched, _batches(groups, n=1, seed=step), _step, groups, step)
    by_group = {}  # group size -> padded elements of its buckets
    for b in ddp.buckets:
        by_group[comm.world(b.group)] = by_group.get(comm.world(b.group), 0) + b.end - b.start
    held = any(is_allocated(b.param) or is_allocated(b.grad) for b in ddp.buckets)
    return dict(sent), by_group, held, ddp.memory_bytes()


def test_zero3_expert_buffers_are_sharded_and_gathered_over_expert_dp():
    """4 ranks, EP2 (expert-DP 2), fp32, one microbatch: per step 3 x 4 bytes x (P (d-1)/d + E (e-1)/e)
    with P the dense and E this rank's expert parameter elements (padded per unit), d = 4, e = 2; between
    steps no full tensor is held; held bytes per rank: P/d + E/e parameters and as many gradients."""
    d, e = 4, 2
    for sent, by_group, held, (params, grads) in spawn(d, _zero3_moe):
        assert sorted(by_group) == [e, d], by_group
        P, E = by_group[d], by_group[e]
        assert sent["dp-params"] == 2 * 4 * (P * (d - 1) / d + E * (e - 1) / e), sent
        assert sent["dp-grads"] == 4 * (P * (d - 1) / d + E * (e - 1) / e), sent
        assert not held
        assert params == grads == 4 * (P // d + E // e)
