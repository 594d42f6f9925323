"""What every HuggingFace conversion checks: every tensor is used, a tied copy is equal to what it is tied
to. Each failure is one CheckpointError line; what a family can hold its module checks (models/families/)."""
import re
from collections.abc import Mapping

from .pieces import CheckpointError


def missing(side, key):
    """The one-line error for a tensor a conversion needs and `side` lacks."""
    return CheckpointError(f"{side} has no tensor {key!r} (missing weights, or its config describes another model, "
                           "e.g. more layers or experts than the weights hold)")


def take(tensors, key, side="the HuggingFace checkpoint"):
    """tensors.pop(key), or the one-line error naming the missing tensor."""
    if key not in tensors:
        raise missing(side, key)
    return tensors.pop(key)


class TrackedTensors(Mapping):
    """A name -> tensor dict that remembers which names were read, so that a conversion can
    refuse the tensors it did not use. `side` names the source in messages."""

    def __init__(self, tensors, side):
        self._t, self._used, self.side = dict(tensors), set(), side

    def __getitem__(self, key):
        if key not in self._t:
            raise missing(self.side, key)
        self._used.add(key)
        return self._t[key]

    def __contains__(self, key):  # without marking it used
        return key in self._t

    def __iter__(self):
        return iter(self._t)

    def __len__(self):
        return len(self._t)

    def mark_used(self, key):
        self._used.add(key)

    def refuse_unused(self, ignore=None):
        """CheckpointError naming every tensor not read (names matching regex `ignore` excepted)."""
        left = sorted(k for k in self._t if k not in self._used and not (ignore and re.search(ignore, k)))
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise CheckpointError(f"{self.side} holds tensors the conversion does not use: {shown} "
                                  "(refusing rather than dropping them)")


def same_as_tied(t, extra, tied_to, why="yet the config ties them (set tie_word_embeddings false in config.json)"):
    """A tied model's file may also store the tied copy (`extra`): accept it only if equal; `why` ends the
    one-line refusal."""
    if extra in t and not t[extra].equal(t[tied_to]):  # reading it marks it used
        raise CheckpointError(f"{t.side}: {extra} differs from {tied_to}, {why}")


def with_whole_norm_weights(args, tensors):
    """tensors with each norm weight as HuggingFace holds it: a checkpoint of --apply-layernorm-1p
    (args' layernorm_zero_centered_gamma) stores w - 1, HF models w. Other tensors are the same objects."""
    if not args.get("layernorm_zero_centered_gamma"):
        return tensors
    return {k: v + 1 if k.endswith("layernorm.weight") else v for k, v in tensors.items()}
