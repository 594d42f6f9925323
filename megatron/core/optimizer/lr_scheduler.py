"""Learning-rate schedule: linear warm-up, then constant, linear, cosine, inverse-square-root or WSD
decay, as Megatron-LM's OptimizerParamScheduler.

The schedule counts steps in samples (one iteration is a global batch; sample-based training gives
its lengths in samples directly) and is set before iteration 1 at step 0: iteration k runs at the
value after the updates of iterations 1..k-1, so iteration 1 of a warm-up runs at init_lr (0). An
iteration whose update was skipped (fp16 overflow) does not advance it.
"""
import math

STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")


class LRScheduler:
    """Sets every param group's lr to get_lr(num_steps); step() advances num_steps.

    warm-up: init_lr + (max_lr - init_lr) * n / warmup_steps while n <= warmup_steps;
    then decay from max_lr to min_lr over (warmup_steps, decay_steps]; min_lr after.
    WSD: max_lr, then anneals over the last wsd_decay_steps (default a tenth of decay_steps) with wsd_style.
    step_size: the steps one successful iteration adds (the global batch size when counting samples).
    decoupled: (max_lr, min_lr) of the param groups marked embedding_or_output (--decoupled-lr,
    --decoupled-min-lr: the word embedding and output layer), on the same warm-up and decay; None: as the rest.
    """

    def __init__(self, optimizer, max_lr, min_lr, decay_steps, warmup_steps=0, style="linear",
                 wsd_decay_steps=None, wsd_style="exponential", init_lr=0.0, step_size=1, decoupled=None):
        if style not in STYLES or wsd_style not in WSD_STYLES:
            raise ValueError(f"unknown lr decay style {style!r} / WSD style {wsd_style!r}")
        if warmup_steps > decay_steps:
            raise ValueError(f"warm-up ({warmup_steps}) is longer than the decay steps ({decay_steps})")
        self.optimizer, self.max_lr, self.min_lr, self.init_lr = optimizer, max_lr, min_lr, init_lr
        self.decay_steps, self.warmup_steps, self.style = decay_steps, warmup_steps, style
        self.wsd_decay_steps = wsd_decay_steps if wsd_decay_steps is not None else max(1, decay_steps // 10)
        self.wsd_style, self.step_size, self.decoupled = wsd_style, step_size, decoupled
        self.num_steps = 0
        self.lr = self._apply()

    def get_lr(self, num_steps, max_lr=None, min_lr=None):
        """The learning rate after num_steps steps (of a group whose peak and floor are max_lr, min_lr:
        default the schedule's)."""
        max_lr = self.max_lr if max_lr is None else max_lr
        min_lr = self.min_lr if min_lr is None else min_lr
        if self.warmup_steps > 0 and num_steps <= self.warmup_steps:
            return self.init_lr + (max_lr - self.init_lr) * num_steps / self.warmup_steps
        if self.style == "constant":
            return max_lr
        if num_steps > self.decay_steps:
            return min_lr
        if self.style == "inverse-square-root":
            return max(min_lr, max_lr * math.sqrt(max(self.warmup_steps, 1) / max(num_steps, 1)))
        delta = max_lr - min_lr
        if self.style == "WSD":
            anneal_start = self.decay_steps - self.wsd_decay_steps
            if num_steps <= anneal_start:
                return max_lr
            ratio = (num_steps - anneal_start) / self.wsd_decay_steps
            coeff = {"linear": 1.0 - ratio,
                     "cosine": 0.5 * (math.cos(math.pi * ratio) + 1.0),
                     "exponential": (2.0 * math.pow(0.5, ratio)) - 1.0,
                     "minus_sqrt": 1.0 - math.sqrt(ratio)}[self.wsd_style]
            return min_lr + coeff * delta
        ratio = (num_steps - self.warmup_steps) / (self.decay_steps - self.warmup_steps)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return min_lr + coeff * delta

    def _apply(self):
        lr = self.get_lr(self.num_steps)
        own = self.get_lr(self.num_steps, *self.decoupled) if self.decoupled else lr
        for group in self.optimizer.param_groups:
            group["lr"] = own if group.get("embedding_or_output") else lr
        return lr

    def step(self, increment=None):
        """Advance by `increment` steps (default step_size, one iteration) and set the optimizer's lr,
        the next iteration's. Returns it."""
        self.num_steps += self.step_size if increment is None else increment
        self.lr = self._apply()
        return self.lr

    def state_dict(self):
        return {"num_steps": self.num_steps}

    def load_state_dict(self, state):
        """Resume at a saved position (the lr is set for the next iteration)."""
        self.num_steps = state["num_steps"]
        self.lr = self._apply()
