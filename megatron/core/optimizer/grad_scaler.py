"""Loss scaling for fp16: constant, or dynamic (back off on overflow, grow when stable)."""


class ConstantGradScaler:
    """A fixed loss scale (--loss-scale)."""

    def __init__(self, scale):
        self.scale = float(scale)

    def update(self, found_inf):
        pass

    def state_dict(self):
        return None  # nothing changes: --loss-scale gives it again

    def load_state_dict(self, state):
        pass


class DynamicGradScaler:
    """Megatron-LM's dynamic scaler.

    On an overflow the hysteresis budget drops by one and, once spent, the scale is
    multiplied by backoff_factor (not below min_scale). After growth_interval clean
    iterations in a row the scale is multiplied by growth_factor and the budget refilled.
    """

    def __init__(self, initial_scale, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=1000, hysteresis=2):
        self.scale = float(initial_scale)
        self.min_scale, self.growth_factor, self.backoff_factor = min_scale, growth_factor, backoff_factor
        self.growth_interval, self.hysteresis = growth_interval, hysteresis
        self._growth_tracker, self._hysteresis_tracker = 0, hysteresis

    def update(self, found_inf):
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self.scale *= self.growth_factor

    def state_dict(self):
        return {"scale": self.scale, "growth": self._growth_tracker, "hysteresis": self._hysteresis_tracker}

    def load_state_dict(self, state):
        self.scale, self._growth_tracker, self._hysteresis_tracker = \
            state["scale"], state["growth"], state["hysteresis"]
