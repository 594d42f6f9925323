"""Batch-size schedules as Megatron-LM counts them (issue 31): --step-batch-size-schedule (Megatron-Core's
StepBatchsizeNumMicroBatchesCalculator, thresholds in tokens) and the older --rampup-batch-size
(RampupBatchsizeNumMicroBatchesCalculator and update_train_iters before April 2026). The expected
sequences below are worked out by hand from those rules, not computed by the code under test."""
import types

import pytest

from megatron.core.errors import ConfigError
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.loop import batch_schedule

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--lr", "1e-3"]
# thresholds in tokens: 96 / 16 = sample 6, 256 / 16 = sample 16
STEPS = ["--step-batch-size-schedule", "0:4 96:8 256:16"]


def _cfgs(args, world=1):
    model_cfg, train_cfg = parse_args(MOCK + args)
    resolve(model_cfg, train_cfg, world, lambda c: types.SimpleNamespace(vocab_size=c.null_vocab_size + 1))
    validate(model_cfg, train_cfg, world)
    return model_cfg, train_cfg


def _walk(schedule, iterations):
    """(batch per iteration, consumed samples after it), as the training loop advances."""
    consumed, batches, after = 0, [], []
    for _ in range(iterations):
        batches.append(schedule.batch_size(consumed))
        consumed += batches[-1]
        after.append(consumed)
    return batches, after


def test_step_schedule_counts_tokens_and_takes_the_last_threshold_reached():
    model_cfg, train_cfg = _cfgs(STEPS + ["--train-iters", "6"])
    assert train_cfg.global_batch_size == 16  # the last size (Megatron-Core's calculator.global_batch_size)
    schedule = batch_schedule.build(train_cfg, model_cfg.seq_length)
    # consumed 0 -> 4; 4 < 6 -> 4; 8 >= 6 -> 8; 16 >= 16 -> 16 ...
    assert _walk(schedule, 6) == ([4, 4, 8, 16, 16, 16], [4, 8, 16, 32, 48, 64])
    # suffixes: 2.4B tokens at --seq-length 2048 is sample 1171875 (integer division)
    assert batch_schedule.parse_steps("0:16 2.4B:320", 2048).steps == [(0, 16), (1171875, 320)]


def test_step_schedule_with_train_samples_runs_while_consumed_is_below_them():
    # consumed 0, 4, 8, 16, 32 < 40 -> five iterations (the last batch whole, consumed 48)
    assert _cfgs(STEPS + ["--train-samples", "40"])[1].train_iters == 5


def test_rampup_is_megatrons_older_ramp():
    _, t = _cfgs(["--rampup-batch-size", "4", "4", "24", "--global-batch-size", "16", "--train-samples", "60"])
    schedule = batch_schedule.build(t, 16)
    # (16 - 4) / 4 = 3 increments over 24 samples: 8 samples each; 4 + int(consumed / 8) x 4 until consumed > 24
    assert _walk(schedule, 6) == ([4, 4, 8, 12, 16, 16], [4, 8, 16, 28, 44, 60])
    # iterations while consumed <= 24: four (consumed 28), then (60 - 28) // 16 = 2 more
    assert t.train_iters == 6


def test_learning_rate_advances_by_each_iterations_batch():
    """The LR schedule counts samples: warm-up 2 x 16 = 32 samples, decay 5 x 16 = 80 (the final batch size)."""
    import torch

    from megatron.training.loop.training import build_scheduler
    _, t = _cfgs(STEPS + ["--train-iters", "6", "--lr-warmup-iters", "2", "--lr-decay-iters", "5", "--min-lr", "1e-4"])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = build_scheduler(opt, t)
    lrs = []
    for batch in [4, 4, 8, 16, 16, 16]:
        lrs.append(scheduler.lr)
        scheduler.step(batch)
    # before iteration k: samples 0, 4, 8, 16, 32 (= warm-up: 1e-3), 48 (decay 1/3 of the way: 1e-4 + 2/3 x 9e-4)
    assert lrs == pytest.approx([0.0, 1.25e-4, 2.5e-4, 5e-4, 1e-3, 7e-4], rel=1e-12)


@pytest.mark.parametrize("args,match", [
    (STEPS + ["--train-iters", "4", "--global-batch-size", "8"], "differs from the last batch size"),
    (["--step-batch-size-schedule", "64:4 96:8", "--train-iters", "4"], "must start at threshold 0"),
    (["--step-batch-size-schedule", "0:8 96:4", "--train-iters", "4"], "must not decrease"),
    (["--step-batch-size-schedule", "0:4 96:x", "--train-iters", "4"], "is not a number"),
    (["--rampup-batch-size", "4", "4", "24", "--train-iters", "4"], "give --train-samples"),
    (["--rampup-batch-size", "4", "5", "24", "--global-batch-size", "16", "--train-samples", "60"], "multiple of"),
    (STEPS + ["--rampup-batch-size", "4", "4", "24", "--train-samples", "60"], "not both"),
])
def test_bad_schedules_are_one_line_errors(args, match):
    with pytest.raises(ConfigError, match=match) as e:
        _cfgs(args)
    assert "\n" not in str(e.value)


def test_every_size_of_the_schedule_must_split_over_dp():
    _cfgs(STEPS + ["--train-iters", "4"], world=2)  # 4, 8, 16 over micro 2 x DP 2
    with pytest.raises(ConfigError, match="batch size 4 of the batch-size schedule"):
        _cfgs(STEPS + ["--train-iters", "4"], world=4)  # 4 over micro 2 x DP 4
