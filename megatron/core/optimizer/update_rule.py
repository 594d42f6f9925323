"""What an optimizer (Adam, SGD, Muon) is to MegatronOptimizer: an update rule over some of its pieces.

MegatronOptimizer (megatron_optimizer.py) owns the pieces (fp32 main values and their gradients, whole
parameters or DP shards of them), the loss scale, the grad norm and clipping, the copy back to the model
and the parameter gather. A rule owns what its optimizer keeps per piece (its state tensors, named in
`state_names`: what checkpoints save and load for those pieces) and how the main values move:

    rule.param_groups      dicts with "params", "lr" (set by the LR schedule), "weight_decay" and
                           "embedding_or_output" (--decoupled-lr)
    rule.state(piece)      {state name: live fp32 tensor of the piece's size}
    rule.step(divisor)     update every piece's main value from its (unscaled) gradient; divisor: the
                           clip divisor tensor (clip_grads.clip_divisor) or None
    rule.scalar_state()    per-run numbers to checkpoint ({} when none), load_scalar_state(state)

Each piece is updated by exactly one rule; which one is update_rules.build's choice.
"""


class UpdateRule:
    name = ""
    state_names: tuple[str, ...] = ()
    # a rule that reads each piece's gradient where DDP keeps it (any dtype) and writes the model's parameter
    # itself (precision_aware_adam.py): MegatronOptimizer copies neither for its pieces
    reads_grad_view = False
    writes_params = False

    def __init__(self, pieces):
        self.pieces = list(pieces)

    @property
    def param_groups(self):
        return []

    def state(self, piece) -> dict:
        raise NotImplementedError

    def step(self, divisor):
        raise NotImplementedError

    def scalar_state(self) -> dict:
        return {}

    def load_scalar_state(self, state):
        pass

    def memory_bytes(self, on_host=False) -> int:
        """Bytes of this rule's state tensors on the device (on_host: on the host)."""
        return sum(t.numel() * t.element_size() for pc in self.pieces if pc.on_host == on_host
                   for t in self.state(pc).values())


def decay_groups(pieces, weight_decay, lr, has_decay, embedding_or_output):
    """Param-group dicts of `pieces`' main values: decayed and not (has_decay(param)), and the same two
    for the word embedding and output layer (embedding_or_output(param)) when there are any."""
    groups = []
    for eo in (False, True):
        mine = [pc for pc in pieces if embedding_or_output(pc.param) == eo]
        if eo and not mine:
            break
        groups += [{"params": [pc.main for pc in mine if has_decay(pc.param)], "weight_decay": weight_decay,
                    "lr": lr, "embedding_or_output": eo},
                   {"params": [pc.main for pc in mine if not has_decay(pc.param)], "weight_decay": 0.0,
                    "lr": lr, "embedding_or_output": eo}]
    return groups
