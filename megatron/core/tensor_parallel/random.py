"""Model-parallel RNG and activation recompute.

Dropout inside TP regions differs per TP rank, outside it is the same.

The default generator (seeded with seed + 100 * pp_rank) is identical across TP ranks,
so dropout on replicated activations (after a row-parallel layer) keeps them identical.
The tracker's "model-parallel-rng" state is seeded with seed + 2718 + tp_rank and is
used, via `fork()`, for dropout on TP-split activations (attention probabilities, and
sequence-parallel shards).
"""
import contextlib

import torch

MODEL_PARALLEL_RNG = "model-parallel-rng"


class RNGStatesTracker:
    """Named generator states for one device, swapped in around a region with fork()."""

    def __init__(self):
        self.states = {}
        self.device = torch.device("cpu")

    def _get(self):
        if self.device.type == "cuda":
            return torch.cuda.get_rng_state(self.device)
        return torch.get_rng_state()

    def _set(self, state):
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state, self.device)
        else:
            torch.set_rng_state(state)

    def reset(self, device=None):
        self.states = {}
        if device is not None:
            self.device = torch.device(device)

    def add(self, name: str, seed: int) -> None:
        if name in self.states:
            raise ValueError(f"RNG state {name!r} already exists")
        saved = self._get()
        if self.device.type == "cuda":
            torch.cuda.manual_seed(seed)
        else:
            torch.manual_seed(seed)
        self.states[name] = self._get()
        self._set(saved)

    def get_states(self):
        """A copy of every named state (for activation recompute and checkpoints)."""
        return {k: v.clone() for k, v in self.states.items()}

    def set_states(self, states):
        self.states = {k: v.clone() for k, v in states.items()}

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG):
        """Run the block with the named state as the device RNG, then put the default back."""
        if name not in self.states:
            raise KeyError(f"RNG state {name!r} was never added (call model_parallel_seed)")
        saved = self._get()
        self._set(self.states[name])
        try:
            yield
        finally:
            self.states[name] = self._get()
            self._set(saved)


# Module state, as torch's own default generator is per process: the tracker holds the named generator states
# beside it (one per process, reset by model_parallel_seed, saved and restored with it by rng_state), and
# dropout forks it deep inside layers that are given groups, not a generator
_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    return _TRACKER


def model_parallel_seed(seed: int, tp_rank: int, pp_rank: int, device) -> None:
    """Seed the default generators (all devices) and the tracker's TP state for this rank."""
    device = torch.device(device)
    torch.manual_seed(seed + 100 * pp_rank)
    _TRACKER.reset(device)
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + 2718 + tp_rank + 100 * pp_rank)


# ----------------------------------------------------------------------------- recompute


def _rng_states():
    """Every generator a forward may draw from: CPU default, CUDA default (this device), tracker."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda, _TRACKER.get_states()


def _set_rng_states(states):
    cpu, cuda, tracker = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)
    _TRACKER.set_states(tracker)


class CheckpointFunction(torch.autograd.Function):
    """Run `function` without keeping its activations; run it again in the backward pass.

    Keeps only the tensor arguments (saved for backward, so memory accounting sees them)
    and the RNG states at the start of the forward. The recompute runs from those same
    states, so dropout draws the same masks, and afterwards every generator is put back
    where it was: the recompute consumes no random numbers as far as later code can tell.
    Non-tensor arguments (tuples of tensors included) are passed through as they are and
    get no gradient. Like Megatron-LM's (reentrant) checkpoint, the output needs at least
    one argument that requires grad, and the backward must come from .backward().
    ctx.backward_runner(outputs, grads, inputs), when the backward that runs this one sets it
    (pipeline_parallel/backward_split.py: a zero-bubble B), runs the recomputed segment's backward.
    """

    @staticmethod
    def forward(ctx, function, *args):
        ctx.function = function
        ctx.rng = _rng_states()
        ctx.tensor_index = [i for i, a in enumerate(args) if torch.is_tensor(a)]
        ctx.others = [None if torch.is_tensor(a) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_index))
        ctx.backward_runner = None
        with torch.no_grad():
            return function(*args)

    @staticmethod
    def backward(ctx, *grads):
        args = list(ctx.others)
        for i, t in zip(ctx.tensor_index, ctx.saved_tensors):
            args[i] = t.detach().requires_grad_(t.requires_grad)
        now = _rng_states()
        _set_rng_states(ctx.rng)
        try:
            with torch.enable_grad():
                outputs = ctx.function(*args)
        finally:
            _set_rng_states(now)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if torch.is_tensor(o) and o.requires_grad and g is not None]
        if pairs and ctx.backward_runner is not None:
            ctx.backward_runner([o for o, _ in pairs], [g for _, g in pairs],
                                [a for a in args if torch.is_tensor(a) and a.requires_grad])
        elif pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None,) + tuple(a.grad if torch.is_tensor(a) else None for a in args)


def checkpoint(function, *args):
    """function(*args), recomputed in the backward pass instead of keeping its activations.

    Outside training (no grad) it is a plain call.
    """
    if not torch.is_grad_enabled():
        return function(*args)
    return CheckpointFunction.apply(function, *args)
