"""DDP buckets, the distributed optimizer and fp16 loss scaling, on real gloo processes."""
import torch

from megatron.core import debug
from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.pipeline_parallel import forward_backward, loss_means
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from tests.harness import spawn


def _setup(groups, **train_kw):
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16,
                            vocab_size=256, hidden_dropout=0.0, attention_dropout=0.0,
                            tensor_model_parallel_size=groups.tp_size)
    t = TrainingConfig(micro_batch_size=2, global_batch_size=4 * groups.dp_size, train_iters=10,
                       lr=1e-3, lr_warmup_iters=0, mock_data=True, tokenizer_type="NullTokenizer", null_vocab_size=256,
                       **train_kw)
    t.validate(groups.dp_size)
    if t.fp16:
        cfg.params_dtype = torch.float16
    model_parallel_seed(5, groups.tp_rank, groups.pp_rank, "cpu")
    model, ddp, opt, sched = setup_model_and_optimizer(
        cfg, t, groups, torch.device("cpu"), lambda c, g, d, **kw: GPTModel(c, g, device=d, **kw))
    return model, ddp, opt, sched


def _batches(groups, n=2, seed=0):
    gen = torch.Generator().manual_seed(seed * 100 + groups.dp_rank)
    out = []
    for _ in range(n):
        t = torch.randint(0, 256, (2, 17), generator=gen)
        out.append({"tokens": t[:, :-1], "labels": t[:, 1:], "loss_mask": torch.ones(2, 16)})
    return out


def _step(model, batch):
    return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}


def _traffic(groups):
    out = []
    for distributed in (False, True):
        model, ddp, opt, sched = _setup(groups, use_distributed_optimizer=distributed, ddp_bucket_size=5000)
        with debug.count_traffic() as sent:
            train_step(model, ddp, opt, sched, _batches(groups), _step, groups, 1)
        grad_bytes = sum(b.grad_data.numel() * b.grad_data.element_size() for b in ddp.buffers)
        param_bytes = sum(b.param_data.numel() * b.param_data.element_size() for b in ddp.buffers) if distributed else 0
        out.append((distributed, dict(sent), grad_bytes, param_bytes, len(ddp.buckets)))
    return out


def test_dp_bytes_sent_match_ring_theory():
    for d in (2, 4):
        for per_rank in spawn(d, _traffic):
            for distributed, traffic, grad_bytes, param_bytes, nb in per_rank:
                assert nb > 1  # several buckets, each reduced once
                if distributed:
                    # reduce-scatter the grads + all-gather the params = one all-reduce's worth
                    assert traffic["dp-grads"] == (d - 1) / d * grad_bytes
                    assert traffic["dp-params"] == (d - 1) / d * param_bytes
                else:
                    assert traffic["dp-grads"] == 2 * (d - 1) / d * grad_bytes
                    assert "dp-params" not in traffic


def _overlap(groups):
    model, ddp, opt, sched = _setup(groups, overlap_grad_reduce=True, ddp_bucket_size=5000)
    started = []
    original = ddp._start_grad_sync
    ddp._start_grad_sync = lambda b: (started.append(ddp.buckets.index(b)), original(b))
    batches = _batches(groups, n=3)
    ddp.start_step(len(batches))
    forward_backward(model, batches, _step, groups)
    during_backward = list(started)  # before finish_grad_sync is called
    ddp.finish_grad_sync()
    return during_backward, len(ddp.buckets)


def test_overlap_starts_every_bucket_during_backward():
    for during, nb in spawn(2, _overlap):
        assert nb > 2
        # every bucket started before backward returned; the last layers' bucket first
        # (later ones need not finish in exact order: the tied embedding's grad lands last)
        assert sorted(during) == list(range(nb)) and during[0] == 0, during


def _fp16_overflow(groups):
    model, ddp, opt, sched = _setup(groups, fp16=True, initial_loss_scale=1024.0, hysteresis=1)
    log = []
    for it in range(1, 6):
        before = [p.detach().clone() for p in model.parameters()]

        def step(m, batch, it=it):
            loss, mask = _step(m, batch)["lm loss"]
            return {"lm loss": (loss * float("inf") if it == 3 else loss, mask)}

        scale = opt.loss_scale
        losses, norm, lr, updated = train_step(model, ddp, opt, sched, _batches(groups, seed=it), step, groups, it)
        loss = loss_means(losses)["lm loss"]
        changed = any(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
        log.append((it, updated, scale, opt.loss_scale, changed, float(loss) if it != 3 else None))
    return log


def test_fp16_overflow_skips_step_halves_scale_and_resumes():
    for log in spawn(2, _fp16_overflow):
        for it, updated, scale_before, scale_after, changed, loss in log:
            if it == 3:
                assert not updated and not changed
                assert scale_after == scale_before / 2
            else:
                assert updated and changed and scale_after == scale_before
                assert loss is not None and loss == loss  # finite training resumes
        assert log[-1][3] == 512.0
