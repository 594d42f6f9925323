"""--optimizer sgd: SGD with momentum (--sgd-momentum) and L2 weight decay, as Megatron-LM's torch SGD."""
import torch

from ..tensor_parallel.param_meta import has_weight_decay, is_embedding_or_output
from .update_rule import UpdateRule, decay_groups


class SGDRule(UpdateRule):
    """torch.optim.SGD over the pieces. Its momentum buffer exists from the start, zero: torch's first step
    then makes it the gradient, as from none (buf * momentum + grad)."""

    name = "sgd"
    state_names = ("momentum_buffer",)

    def __init__(self, pieces, lr, weight_decay, momentum):
        super().__init__(pieces)
        groups = decay_groups(self.pieces, weight_decay, lr, has_weight_decay, is_embedding_or_output)
        self.opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, foreach=True) if self.pieces else None
        for pc in self.pieces:
            self.opt.state[pc.main] = {"momentum_buffer": torch.zeros_like(pc.main)}

    @property
    def param_groups(self):
        return self.opt.param_groups if self.opt is not None else []

    def state(self, piece):
        return {"momentum_buffer": self.opt.state[piece.main]["momentum_buffer"]}

    def step(self, divisor):
        if self.opt is None:
            return
        if divisor is not None:
            torch._foreach_div_([pc.main.grad for pc in self.pieces], divisor)
        self.opt.step()
