"""The learning rate each iteration runs at, as Megatron-LM's OptimizerParamScheduler: the schedule is
set at step 0 before iteration 1 and advances by one global batch of samples after each successful
update, so iteration k runs at the value after k - 1 updates; a skipped (fp16 overflow) iteration does
not advance it. Expected values are worked out by hand in the comments."""
import types

import pytest
import torch

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop import training
from megatron.training.loop.training import build_scheduler, train_step


def _scheduler(**kw):
    t = TrainingConfig(lr=1.0, micro_batch_size=8, global_batch_size=8, mock_data=True, **kw)
    t.resolve(1)
    t.check_schedule()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=123.0)
    return build_scheduler(opt, t), opt


def _lrs(sched, n):
    out = []
    for _ in range(n):
        out.append(sched.lr)
        sched.step()
    return out


def test_warmup_iterations_1_to_5():
    # warm-up 4 iterations = 32 samples, decay to 0 over 10 iterations = 80 samples (linear, the default):
    # iteration k runs at (k - 1) * 8 / 32 during warm-up; iteration 6 at 1 - (40 - 32) / (80 - 32) = 5/6
    sched, opt = _scheduler(train_iters=10, lr_warmup_iters=4)
    assert opt.param_groups[0]["lr"] == 0.0  # set before iteration 1
    assert _lrs(sched, 6) == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 5 / 6])


def test_warmup_init_and_cosine():
    # from --lr-warmup-init 0.2: 0.2 + 0.8 * (k - 1) / 2; then cosine over 8 decay iterations (16..64 samples):
    # iteration 4 is at 24 samples, ratio 8 / 48 -> 0.5 * (cos(pi / 6) + 1)
    sched, _ = _scheduler(train_iters=8, lr_warmup_iters=2, lr_warmup_init=0.2, lr_decay_style="cosine")
    assert _lrs(sched, 4) == pytest.approx([0.2, 0.6, 1.0, 0.5 * (3 ** 0.5 / 2 + 1)])


def test_warmup_fraction_is_not_rounded():
    # 0.15 x 80 samples = 12 samples of warm-up (1.5 iterations): 0, 8/12, then linear decay
    # (16 - 12) / (80 - 12) of the way down at iteration 3
    sched, _ = _scheduler(train_iters=10, lr_warmup_fraction=0.15)
    assert _lrs(sched, 3) == pytest.approx([0.0, 8 / 12, 1 - 4 / 68])


def test_sample_based_schedule():
    # 100 samples of 8: 12 iterations; warm-up 20 samples, decay over 60: iteration k at (k - 1) * 8 samples
    sched, _ = _scheduler(train_samples=100, lr_warmup_samples=20, lr_decay_samples=60)
    lrs = _lrs(sched, 5)
    assert lrs == pytest.approx([0.0, 8 / 20, 16 / 20, 1 - 4 / 40, 1 - 12 / 40])


def test_train_iters_from_samples():
    t = TrainingConfig(lr=1.0, micro_batch_size=4, train_samples=103, mock_data=True, tokenizer_type="NullTokenizer",
                       null_vocab_size=16)
    t.resolve(2)  # global batch 8
    assert t.train_iters == 12  # 103 // 8, as Megatron-LM (the partial batch is not trained)
    t.validate(2)  # a resolved sample-based config stays valid


def _fake_step(updates):
    """train_step's collaborators: an empty model, an optimizer whose step() reports `updates` in turn."""
    steps = iter(updates)
    ddp = types.SimpleNamespace(start_step=lambda n: None, config=DistributedDataParallelConfig(),
                                refresh_fp8_weights=lambda: None)
    opt = types.SimpleNamespace(loss_scale=None, step=lambda timers=None: (next(steps), None))
    return ddp, opt


def test_a_skipped_iteration_does_not_advance_the_schedule(monkeypatch):
    monkeypatch.setattr(training, "finalize_model_grads", lambda *a: None)
    sched, _ = _scheduler(train_iters=10, lr_warmup_iters=4)
    ddp, opt = _fake_step([True, False, True, True])
    model = torch.nn.ModuleList()
    ran = [train_step(model, ddp, opt, sched, [], None, None, it, lambda *a, **k: {})[2] for it in range(1, 5)]
    # iteration 2 overflowed: iteration 3 runs at iteration 2's rate
    assert ran == pytest.approx([0.0, 0.25, 0.25, 0.5])
    assert sched.state_dict() == {"num_steps": 24}


def test_state_dict_round_trip():
    a, _ = _scheduler(train_iters=10, lr_warmup_iters=4)
    _lrs(a, 3)
    b, opt = _scheduler(train_iters=10, lr_warmup_iters=4)
    b.load_state_dict(a.state_dict())
    assert b.lr == a.lr == opt.param_groups[0]["lr"] == pytest.approx(0.75)
