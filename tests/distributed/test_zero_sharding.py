"""ZeRO-2 / ZeRO-3 (--data-parallel-sharding-strategy optim_grads / optim_grads_params) on real
gloo processes: bytes sent per step against theory, what is held between steps."""
import torch

from megatron.core import debug
from megatron.core.config import TransformerConfig
from megatron.core.distributed.sharded_buffer import is_allocated
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from tests.harness import spawn

from .test_data_parallel import _batches, _step


def _setup(groups, strategy, micro):
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16,
                            vocab_size=256, hidden_dropout=0.0, attention_dropout=0.0)
    t = TrainingConfig(micro_batch_size=2, global_batch_size=2 * micro * groups.dp_size, train_iters=10,
                       lr=1e-3, lr_warmup_iters=0, mock_data=True, tokenizer_type="NullTokenizer", null_vocab_size=256,
                       data_parallel_sharding_strategy=strategy)
    t.resolve_sharding()
    t.validate(groups.dp_size)
    model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
    return setup_model_and_optimizer(cfg, t, groups, torch.device("cpu"),
                                     lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))


def _zero3_traffic(groups):
    out = []
    for micro in (1, 2):
        model, ddp, opt, sched = _setup(groups, "optim_grads_params", micro)
        for step in (1, 2):  # the first step also takes the shards from the initial values
            with debug.count_traffic() as sent:
                train_step(model, ddp, opt, sched, _batches(groups, n=micro, seed=step), _step, groups, step)
        padded = sum(b.end - b.start for b in ddp.buckets)  # elements, padding included
        held = [is_allocated(b.param) or is_allocated(b.grad) for b in ddp.buckets]
        out.append((micro, dict(sent), padded, len(ddp.buckets), any(held)))
    return out


def _zero2_between_steps(groups):
    model, ddp, opt, sched = _setup(groups, "optim_grads", 2)
    train_step(model, ddp, opt, sched, _batches(groups, n=2), _step, groups, 1)
    grads_held = [is_allocated(b.grad) for b in ddp.buckets]
    params_held = [is_allocated(b.param) for b in ddp.buckets]
    return grads_held, params_held, ddp.memory_bytes()


def _both(groups):
    return _zero3_traffic(groups), _zero2_between_steps(groups)


def test_zero3_traffic_and_what_zero2_and_zero3_hold_between_steps():
    """ZeRO-3, fp32, d = 4 DP ranks, P parameter elements (units padded to multiples of d): per step
    an all-gather of P (d-1)/d before each forward and each backward, one reduce-scatter of the
    gradients: 3 P (d-1)/d x 4 bytes; each further microbatch adds 2 P (d-1)/d x 4 bytes. Between
    steps ZeRO-3 holds no full parameter or gradient tensor, ZeRO-2 no full gradient tensor."""
    d = 4
    for zero3, (grads_held, params_held, (params, grads)) in spawn(d, _both):
        for micro, sent, padded, nb, held in zero3:
            assert nb == 3  # one unit per layer, one root unit
            assert sent["dp-params"] == 2 * micro * padded * 4 * (d - 1) / d, (micro, sent)
            assert sent["dp-grads"] == padded * 4 * (d - 1) / d, (micro, sent)
            if micro == 1:
                assert sum(sent.values()) == 3 * padded * 4 * (d - 1) / d
            assert not held
        assert not any(grads_held) and all(params_held)
        assert d * grads == params  # fp32: N/d gradient elements against N parameter elements
