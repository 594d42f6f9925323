"""The precision-aware AdamW (--use-precision-aware-optimizer) on 2 gloo ranks: the distributed optimizer
(ZeRO-1) and ZeRO-3 update their DP shards to exactly the bits the reference step gives whole parameters
(no_shard), for fp32 states and for bf16 model, main gradients and moments: over 2 ranks a sum is the same in
any order, and the step updates each element alike however the shards fall (no clipping: the norm's sum over
shards would differ in the last bit; the clip divisor is tests/unit/test_adamw_step.py's)."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer.precision_aware_adam import PrecisionAwareAdamRule
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from tests.harness import spawn

from .test_data_parallel import _batches, _step

PRECISIONS = {
    "fp32": dict(bf16=False),
    "bf16-states": dict(bf16=True, main_grads_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"),
}


def _gpt(cfg, groups, device, **kw):
    return GPTModel(cfg, groups, device=device, **kw)


def _train(groups, strategy, precision):
    """precision None: the ordinary optimizer (torch's fused AdamW on fp32 main values)."""
    flags = PRECISIONS[precision or "fp32"]
    dtype = torch.bfloat16 if flags["bf16"] else torch.float32
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=256,
                            hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dtype)
    t = TrainingConfig(micro_batch_size=2, global_batch_size=8, train_iters=10, lr=1e-2, lr_warmup_iters=0,
                       clip_grad=0.0, mock_data=True, tokenizer_type="NullTokenizer", null_vocab_size=256,
                       data_parallel_sharding_strategy=strategy, use_precision_aware_optimizer=precision is not None,
                       ddp_bucket_size=3000, **flags)
    t.resolve_sharding()
    t.resolve_main_grads()
    if strategy != "no_shard":  # the CLI refuses the flag without a ZeRO strategy; the reference runs it whole
        t.validate(groups.dp_size)
    model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
    model, ddp, opt, sched = setup_model_and_optimizer(cfg, t, groups, torch.device("cpu"), _gpt)
    assert precision is None or all(isinstance(rule, PrecisionAwareAdamRule) for rule in opt.rules)
    want_grad = torch.bfloat16 if flags.get("main_grads_dtype") == "bf16" else torch.float32
    assert {pc.grad_view.dtype for pc in opt._pieces} == {want_grad}
    assert {s.dtype for pc in opt._pieces for s in pc.state().values()} == {torch.bfloat16 if flags["bf16"]
                                                                            else torch.float32}
    losses = []
    for step in (1, 2, 3):
        out = train_step(model, ddp, opt, sched, _batches(groups, n=2, seed=step), _step, groups, step)
        losses.append(float(out[0]["lm loss"][0] / out[0]["lm loss"][1]))
    ddp.finish_param_sync()
    if ddp.gatherer is not None:  # ZeRO-3: gather every bucket to read the full parameters
        for bucket in ddp.gatherer.order:
            ddp.gatherer.start_gather(bucket)
        ddp.gatherer.wait_all()
    return losses, {name: p.detach().float().tolist() for name, p in model.named_parameters()}


def _all(groups, precision):
    runs = [_train(groups, s, precision) for s in ("no_shard", "optim", "optim_grads_params")]
    return runs + ([_train(groups, "no_shard", None)] if precision == "fp32" else [])


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_sharded_precision_aware_steps_are_the_whole_reference_bitwise(precision):
    for (ref_losses, ref_params), *others in spawn(2, _all, precision):
        for strategy, (losses, params) in zip(("optim", "optim_grads_params"), others[:2]):
            assert losses == ref_losses, (strategy, losses, ref_losses)
            assert params == ref_params, strategy
        if precision == "fp32":  # the same AdamW as torch's, up to the order of its fp32 operations
            losses, params = others[2]
            assert max(abs(a - b) / b for a, b in zip(losses, ref_losses)) < 1e-6, (losses, ref_losses)
            # the weights only: the key bias's true gradient is 0 (softmax ignores it), so Adam moves it by
            # the sign of rounding noise, which any change of order redraws
            for name, values in params.items():
                if not name.endswith("weight"):
                    continue
                diff = (torch.tensor(values) - torch.tensor(ref_params[name])).abs().max().item()
                assert diff < 1e-6, (name, diff)
