"""ZeRO-3 with MoE expert parallelism on real gloo processes: the expert buffers are sharded and
gathered over the expert-data-parallel group, the dense ones over DP (over an expert-DP group of one
rank they stay whole); bytes sent and held per step against theory."""
import torch

from megatron.core import comm, debug, parallel_state
from megatron.core.config import TransformerConfig
from megatron.core.distributed.sharded_buffer import is_allocated
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from tests.harness import spawn

from .test_data_parallel import _batches, _step


def _zero3_moe(groups, ep):
    groups = parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=ep)
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=256,
                            hidden_dropout=0.0, attention_dropout=0.0, num_experts=4, moe_ffn_hidden_size=24,
                            add_bias_linear=False, expert_model_parallel_size=ep)
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
    held = [is_allocated(b.param) or is_allocated(b.grad) for b in ddp.buckets if comm.world(b.group) > 1]
    whole = [b.whole and is_allocated(b.param) for b in ddp.buckets if comm.world(b.group) == 1]
    return dict(sent), by_group, any(held), whole, ddp.memory_bytes()


def _ep2_then_ep4(groups):
    return _zero3_moe(groups, 2), _zero3_moe(groups, 4)


def test_zero3_expert_buffers_are_sharded_and_gathered_over_expert_dp():
    """4 ranks, fp32, one microbatch. EP2 (expert-DP e = 2): per step 3 x 4 bytes x (P (d-1)/d + E (e-1)/e)
    with P the dense and E this rank's expert parameter elements (padded per unit), d = 4; between steps
    no full tensor is held; held bytes per rank: P/d + E/e parameters and as many gradients. EP4
    (e = 1): nothing sent for the experts, their buckets are their shards, whole and never released."""
    d = 4
    for (sent, by_group, held, whole, (params, grads)), ep4 in spawn(d, _ep2_then_ep4):
        assert sorted(by_group) == [2, d] and not whole, by_group
        P, E = by_group[d], by_group[2]
        assert sent["dp-params"] == 2 * 4 * (P * (d - 1) / d + E / 2), sent
        assert sent["dp-grads"] == 4 * (P * (d - 1) / d + E / 2), sent
        assert not held
        assert params == grads == 4 * (P // d + E // 2)
        sent, by_group, held, whole, (params, grads) = ep4
        assert sorted(by_group) == [1, d] and whole and all(whole), by_group
        P, E = by_group[d], by_group[1]
        assert sent["dp-params"] == 2 * 4 * P * (d - 1) / d and sent["dp-grads"] == 4 * P * (d - 1) / d, sent
        assert not held
        assert params == grads == 4 * (P // d + E)
