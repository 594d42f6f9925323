"""AdamW (torch's fused kernel) as an update rule; with --optimizer-cpu-offload a second AdamW on the host
takes the offloaded pieces (cpu_offload.py)."""
import torch

from ..tensor_parallel.param_meta import has_weight_decay, is_embedding_or_output
from .update_rule import UpdateRule, decay_groups

ADAM_STATES = ("exp_avg", "exp_avg_sq")


def _adamw(pieces, weight_decay, lr, betas, eps):
    """Fused AdamW over `pieces`' main values (update_rule.decay_groups); None when there are none."""
    if not pieces:
        return None
    groups = decay_groups(pieces, weight_decay, lr, has_weight_decay, is_embedding_or_output)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)


class AdamRule(UpdateRule):
    """Adam's two moments per piece and its step count; the clip divisor goes to the fused step as its
    grad_scale (the channel torch's GradScaler uses), so clipping costs no pass of its own over the
    device gradients. Offloaded pieces arrive clipped already (MegatronOptimizer.step)."""

    name = "adam"
    state_names = ADAM_STATES

    def __init__(self, pieces, lr, weight_decay, betas, eps):
        super().__init__(pieces)
        self.device = _adamw([pc for pc in self.pieces if not pc.on_host], weight_decay, lr, betas, eps)
        self.host = _adamw([pc for pc in self.pieces if pc.on_host], weight_decay, lr, betas, eps)
        self._opt = {}
        for pc in self.pieces:  # the state exists from the start: memory is accounted at start-up
            opt = self.host if pc.on_host else self.device
            opt.state[pc.main] = {"step": torch.zeros((), dtype=torch.float32, device=pc.main.device),
                                  "exp_avg": torch.zeros_like(pc.main), "exp_avg_sq": torch.zeros_like(pc.main)}
            self._opt[id(pc)] = opt

    @property
    def param_groups(self):
        return [g for opt in (self.device, self.host) if opt is not None for g in opt.param_groups]

    def state(self, piece):
        s = self._opt[id(piece)].state[piece.main]
        return {k: s[k] for k in ADAM_STATES}

    def step(self, divisor):
        if self.device is not None:
            self.device.grad_scale = divisor
        for opt in (self.device, self.host):
            if opt is not None:
                opt.step()

    def scalar_state(self):
        steps = [self._opt[id(pc)].state[pc.main]["step"] for pc in self.pieces]
        return {"step": float(steps[0])} if steps else {}

    def load_scalar_state(self, state):
        for pc in self.pieces:
            self._opt[id(pc)].state[pc.main]["step"].fill_(state.get("step", 0.0))
