"""Learning-rate schedule: linear warm-up, then constant, linear, cosine or WSD decay."""
import math


class LRScheduler:
    """lr(step) for step = 1, 2, ... (the iteration being run); sets it on the optimizer.

    warm-up: max_lr * step / warmup_steps for step <= warmup_steps;
    decay from max_lr to min_lr over (warmup_steps, decay_steps]; min_lr after.
    WSD: stays at max_lr, then anneals over the last wsd_decay_steps with wsd_style.
    """

    def __init__(self, optimizer, max_lr, min_lr, decay_steps, warmup_steps=0, style="cosine",
                 wsd_decay_steps=None, wsd_style="linear"):
        if style not in ("constant", "linear", "cosine", "WSD"):
            raise ValueError(f"unknown lr decay style {style!r}")
        if warmup_steps > decay_steps:
            raise ValueError(f"warm-up ({warmup_steps}) is longer than the decay iterations ({decay_steps})")
        self.optimizer, self.max_lr, self.min_lr = optimizer, max_lr, min_lr
        self.decay_steps, self.warmup_steps, self.style = decay_steps, warmup_steps, style
        self.wsd_decay_steps = wsd_decay_steps if wsd_decay_steps is not None else max(1, decay_steps // 10)
        self.wsd_style = wsd_style

    def get_lr(self, step):
        if self.warmup_steps > 0 and step <= self.warmup_steps:
            return self.max_lr * step / self.warmup_steps
        if self.style == "constant":
            return self.max_lr
        if step > self.decay_steps:
            return self.min_lr
        delta = self.max_lr - self.min_lr
        if self.style == "WSD":
            anneal_start = self.decay_steps - self.wsd_decay_steps
            if step <= anneal_start:
                return self.max_lr
            ratio = (step - anneal_start) / self.wsd_decay_steps
            coeff = {"linear": 1.0 - ratio,
                     "cosine": 0.5 * (math.cos(math.pi * ratio) + 1.0),
                     "exponential": (2.0 * math.pow(0.5, ratio)) - 1.0,
                     "minus_sqrt": 1.0 - math.sqrt(ratio)}[self.wsd_style]
            return self.min_lr + coeff * delta
        ratio = (step - self.warmup_steps) / max(1, self.decay_steps - self.warmup_steps)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * delta

    def step(self, step):
        """Set the optimizer's LR for iteration `step`; returns it."""
        lr = self.get_lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr
