"""--fp8-param-gather on real gloo processes (TP2 x DP2): the FP8 weights' buckets cross DP as one byte per
element, the bytes are the linear's own cast of the whole weight, nothing else changes.

Each strategy (ZeRO-1, -2, -3) runs the same three steps twice, with and without the flag, in one process
world. Over two DP ranks and two TP ranks every sum is of two operands (exact in any order) and the
gradient is not clipped (the grad norm sums the buffers' pieces in their order, which the FP8 weights'
buffers of their own change), so the losses must be bitwise equal.
"""
import pytest
import torch

from megatron.core import debug
from megatron.core.config import TransformerConfig
from megatron.core.distributed.fp8_param_gather import own_values
from megatron.core.fp8.formats import E4M3, quantize, scale_from_amax
from megatron.core.fp8.weights import fp8_weight_pairs
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from megatron.training.planner.memory import estimate
from tests.harness import spawn

from .test_data_parallel import _batches, _step

STEPS = 3


def _setup(groups, strategy, recipe, gather):
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=256,
                            hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=groups.tp_size,
                            fp8_format="hybrid", fp8_recipe=recipe, fp8_amax_history_len=2,
                            fp8_param_gather=gather)
    t = TrainingConfig(micro_batch_size=2, global_batch_size=4 * groups.dp_size, train_iters=10, lr=1e-2,
                       lr_warmup_iters=0, clip_grad=0.0, mock_data=True, tokenizer_type="NullTokenizer",
                       null_vocab_size=256, data_parallel_sharding_strategy=strategy)
    t.resolve_sharding()
    t.validate(groups.dp_size)
    model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
    built = setup_model_and_optimizer(cfg, t, groups, torch.device("cpu"),
                                      lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))
    return built, estimate(cfg, t, groups.world_size)["params"]


def _whole(bucket):
    """The bucket's current high-precision values, gathered from every rank's shard."""
    own = own_values(bucket)
    parts = [torch.empty_like(own) for _ in range(torch.distributed.get_world_size(bucket.group))]
    torch.distributed.all_gather(parts, own.contiguous(), group=bucket.group)
    return torch.cat(parts)


def _copies_are_the_linears_cast(ddp, groups, recipe):
    """Per FP8 weight: its copy's bytes equal quantize(whole weight, scale), where scale is tensorwise's of the
    whole weight's amax (MAX over TP), or delayed scaling's history scale. -> the number of weights checked."""
    checked = 0
    for fb in ddp.fp8_buckets():
        b = fb.bucket
        values = _whole(b)
        if ddp.gatherer is not None:
            ddp.gatherer.gather((b,))
        for (p, off, rec), copy in zip(fb.entries, fb.copies):
            w = values[off - b.start:off - b.start + p.numel()].view(p.shape)
            if recipe == "tensorwise":
                a = w.abs().amax().float()
                torch.distributed.all_reduce(a, op=torch.distributed.ReduceOp.MAX, group=groups.tp)
                assert torch.equal(copy.scale, scale_from_amax(a, E4M3)), (copy.scale, a)
            else:
                assert torch.equal(copy.scale, rec.weight_scaler().scale_)
            assert torch.equal(copy.data.view(torch.uint8), quantize(w, copy.scale, E4M3).view(torch.uint8))
            assert rec._weight_copy is copy  # the GEMMs read it
            checked += 1
        if ddp.gatherer is not None:
            ddp.gatherer.release(b)
    return checked


def _run(groups, strategy, recipe):
    out = {}
    for gather in (False, True):
        (model, ddp, opt, sched), estimated = _setup(groups, strategy, recipe, gather)
        losses, sent, checked = [], [], []
        for step in range(1, STEPS + 1):
            with debug.count_traffic() as traffic:
                got = train_step(model, ddp, opt, sched, _batches(groups, n=2, seed=step), _step, groups, step)[0]
            ddp.finish_param_sync()
            losses.append(got["lm loss"][0].item())
            sent.append(traffic.get("dp-params", 0))
            if gather:
                checked.append(_copies_are_the_linears_cast(ddp, groups, recipe))
        fp8_elements = sum(fb.full.numel() for fb in ddp.fp8_buckets())
        weights = sum(p.numel() for p, _ in fp8_weight_pairs(model))
        out[gather] = (losses, sent, checked, fp8_elements, weights, ddp.memory_bytes()[0], estimated)
    return out


CASES = [("optim", "tensorwise"), ("optim_grads", "delayed"), ("optim_grads_params", "tensorwise"),
         ("optim_grads_params", "delayed")]


@pytest.mark.parametrize("strategy,recipe", CASES, ids=[f"{s}-{r}" for s, r in CASES])
def test_fp8_param_gather_moves_bytes_and_changes_no_loss(strategy, recipe):
    """The estimator's parameter bytes are those held. Per step, DP 2: ZeRO-1/2 gather every bucket once (fp32:
    4 bytes per element; the FP8 weights' buckets 1 byte), ZeRO-3 before each of 2 microbatches' forward and
    backward; (d - 1) / d of each is sent."""
    d, gathers = 2, (4 if strategy == "optim_grads_params" else 1)
    for rank_out in spawn(4, _run, strategy, recipe, tp=2):
        (base, base_sent, _, _, _, base_bytes, _), (losses, sent, checked, n8, weights, held, estimated) = \
            rank_out[False], rank_out[True]
        assert estimated == held, (estimated, held)  # the memory estimator counts the FP8 copies
        assert losses == base, (losses, base)
        # QKV, projection, fc1, fc2 of 2 layers; their buckets' padding to a multiple of d
        assert n8 >= weights > 0 and checked == [8] * STEPS, (n8, weights, checked)
        per_gather = n8 * (d - 1) / d
        want = [s - gathers * 3 * per_gather for s in base_sent]  # 1 byte per element where fp32 sent 4
        if gathers == 1:  # ZeRO-1/2's first step also gathers the cast of the initial weights (ZeRO-3: per unit)
            want[0] += per_gather
        assert sent == want, (sent, want, base_sent)
        # ZeRO-3 holds the FP8 shards across the step (n/d bytes); ZeRO-1/2 the full FP8 copies (n bytes)
        assert held - base_bytes == (n8 // d if strategy == "optim_grads_params" else n8), (held, base_bytes, n8)
