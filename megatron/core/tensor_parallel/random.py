"""Model-parallel RNG: dropout inside TP regions differs per TP rank, outside it is the same.

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


_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    return _TRACKER


def model_parallel_seed(seed: int, tp_rank: int, pp_rank: int, device) -> None:
    """Seed the default generators (all devices) and the tracker's TP state for this rank."""
    device = torch.device(device)
    torch.manual_seed(seed + 100 * pp_rank)
    _TRACKER.reset(device)
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + 2718 + tp_rank + 100 * pp_rank)
