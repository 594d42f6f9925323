"""ZeRO-3 (optim_grads_params) with parameters of two dtypes, on 2 gloo ranks: a bf16 GPT whose norms
are kept in fp32 (as a model provider may build it; the CLI builds every parameter in one dtype). Each
dtype gets its own sharded buffer and a layer unit one bucket in each, gathered together. The losses
and the updated parameters of 3 steps equal the distributed optimizer's (ZeRO-1) bitwise: over 2 ranks
a sum is the same in any order, and AdamW updates each element alike, however the shards fall (no
clipping: the norm's sum over shards would differ in the last bit)."""
import torch

from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.core.transformer.norm import LayerNorm
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from tests.harness import spawn

from .test_data_parallel import _batches, _step


def _mixed_gpt(cfg, groups, device, **kw):
    model = GPTModel(cfg, groups, device=device, **kw)
    for m in model.modules():
        if isinstance(m, LayerNorm):
            m.float()
    return model


def _train(groups, strategy):
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=256,
                            hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.bfloat16)
    t = TrainingConfig(micro_batch_size=2, global_batch_size=8, train_iters=10, lr=1e-2, lr_warmup_iters=0,
                       clip_grad=0.0, bf16=True, mock_data=True, tokenizer_type="NullTokenizer",
                       null_vocab_size=256, data_parallel_sharding_strategy=strategy)
    t.resolve_sharding()
    t.validate(groups.dp_size)
    model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
    model, ddp, opt, sched = setup_model_and_optimizer(cfg, t, groups, torch.device("cpu"), _mixed_gpt)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16, torch.float32}
    losses = []
    for step in (1, 2, 3):
        out = train_step(model, ddp, opt, sched, _batches(groups, n=2, seed=step), _step, groups, step)
        losses.append(float(out[0]["lm loss"][0] / out[0]["lm loss"][1]))
    ddp.finish_param_sync()
    if ddp.gatherer is not None:  # ZeRO-3: gather every bucket to read the full parameters
        for bucket in ddp.gatherer.order:
            ddp.gatherer.start_gather(bucket)
        ddp.gatherer.wait_all()
    params = {name: (str(p.dtype), p.detach().float().tolist()) for name, p in model.named_parameters()}
    return losses, params, ddp.describe()


def _both(groups):
    return _train(groups, "optim"), _train(groups, "optim_grads_params")


def test_zero3_with_bf16_and_fp32_parameters_is_zero1_bitwise():
    for (losses1, params1, _), (losses3, params3, line) in spawn(2, _both):
        assert losses3 == losses1, (losses3, losses1)
        assert params3 == params1
        assert "gathered parameters up to" in line
        assert len({dtype for dtype, _ in params3.values()}) == 2
