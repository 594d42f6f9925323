"""The learning-rate schedule against hand-computed values."""
import math

import pytest
import torch

from megatron.core.optimizer import LRScheduler


def sched(**kw):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    args = dict(max_lr=1.0, min_lr=0.1, decay_steps=100, warmup_steps=10)
    args.update(kw)
    return LRScheduler(opt, **args), opt


def test_warmup_is_linear_from_zero():
    s, _ = sched(style="cosine")
    assert s.get_lr(1) == pytest.approx(0.1)
    assert s.get_lr(5) == pytest.approx(0.5)
    assert s.get_lr(10) == pytest.approx(1.0)


@pytest.mark.parametrize("style,mid", [("linear", 0.55), ("cosine", 0.55), ("constant", 1.0)])
def test_decay_midpoint_and_end(style, mid):
    s, _ = sched(style=style)
    assert s.get_lr(55) == pytest.approx(mid)  # halfway between warm-up end and decay end
    assert s.get_lr(100) == pytest.approx(0.1 if style != "constant" else 1.0)
    assert s.get_lr(500) == pytest.approx(0.1 if style != "constant" else 1.0)


def test_cosine_quarter():
    s, _ = sched(style="cosine", warmup_steps=0)
    assert s.get_lr(25) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))


@pytest.mark.parametrize("wsd_style", ["linear", "cosine", "exponential", "minus_sqrt"])
def test_wsd_stable_then_anneals(wsd_style):
    s, _ = sched(style="WSD", wsd_decay_steps=20, wsd_style=wsd_style)
    assert s.get_lr(50) == 1.0 and s.get_lr(80) == 1.0
    assert 0.1 < s.get_lr(90) < 1.0
    assert s.get_lr(100) == pytest.approx(0.1)


def test_step_sets_every_group():
    s, opt = sched(style="linear")
    assert s.step(5) == pytest.approx(0.5)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)


def test_warmup_longer_than_decay_is_rejected():
    with pytest.raises(ValueError, match="warm-up"):
        sched(warmup_steps=200)
