"""Where a per-tensor scale comes from: the tensor now (current scaling) or the amax history (delayed).

A tensor split over ranks (a sequence-parallel or context-parallel piece, a row-parallel input, a
TP-sharded weight or output gradient) takes the MAX of its pieces' amaxes over `groups`, the process
groups that hold its pieces: its scale is then the one-process tensor's, and every element is quantised
as one process quantises it. Groups come from the layer that owns the scaler; None entries are skipped.
"""
import torch
from torch import nn

from .. import comm
from .formats import amax, scale_from_amax


def reduced_amax(x: torch.Tensor, groups) -> torch.Tensor:
    a = amax(x)
    for g in groups:
        if g is not None:
            comm.all_reduce_max_(a, g)
    return a


def reduced_amaxes(parts, labels, n, groups) -> torch.Tensor:
    """[n] fp32: for each of n micro-batches the MAX of its parts' amaxes over `groups` (parts[i] is micro-batch
    labels[i]'s rows here, labels distinct; 0 for one with no rows anywhere). One reduction for all of them: the
    ranks of a group hold different sets of micro-batches, and each makes this one call."""
    a = torch.zeros(n, dtype=torch.float32, device=parts[0].device)
    a[torch.tensor(labels, device=a.device)] = torch.stack([amax(p) for p in parts])
    for g in groups:
        if g is not None:
            comm.all_reduce_max_(a, g)
    return a


class CurrentScaler:
    """Tensorwise current scaling: the scale of the amax of the tensor being cast now."""

    def __init__(self, dtype, margin, groups):
        self.dtype, self.margin, self.groups = dtype, margin, tuple(groups)

    def scale(self, x):
        return scale_from_amax(reduced_amax(x, self.groups), self.dtype, self.margin)

    def scale_of_amax(self, a):
        """The scale of a tensor whose amax, reduced over its pieces, is `a` (--fp8-param-gather's casts)."""
        return scale_from_amax(a, self.dtype, self.margin)

    def scales(self, parts, labels, n):
        """The scales of parts[i], micro-batch labels[i]'s rows (labels distinct, of n): each its micro-batch's."""
        a = reduced_amaxes(parts, labels, n, self.groups)
        return [self.scale_of_amax(a[m]) for m in labels]


class DelayedScaler(nn.Module):
    """Delayed scaling: the scale of the amax history (--fp8-amax-history-len steps, newest first; max or
    most_recent of it), fixed during a step. Each cast records its tensor's amax; update(), after the
    optimizer step, reduces the step's amax over the pieces' groups and the step groups (the data-parallel
    ranks that ran the step's other microbatches), pushes it into the history and recomputes the scale.

    Before the first update the history is empty (Transformer Engine starts from scale 1, which flushes
    small gradients to zero in the first step): that step is cast with current scaling instead.
    The history and scale are buffers: they travel in the model's state dict and the checkpoint.
    """

    def __init__(self, dtype, margin, groups, history_len, algo, expert=False):
        super().__init__()
        self.dtype, self.margin, self.groups, self.algo = dtype, margin, tuple(groups), algo
        self.expert = expert  # an expert's: its step amax reduces over expert-DP (step.after_step)
        self.register_buffer("amax_history", torch.zeros(history_len))
        self.register_buffer("scale_", torch.ones(()))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))
        self.step_amax = None
        self._has_history = False  # cached: reading `updates` is a host sync on a GPU

    def _history(self) -> bool:
        if not self._has_history:  # until the first update, or the first cast after a checkpoint's load
            self._has_history = bool(self.updates)
        return self._has_history

    def scale(self, x):
        """The scale to cast x with; in training, x's amax joins the step's (evaluation records nothing).
        With a history the amax is this piece's (update() reduces it); without, the reduced one is needed now."""
        return self.scale_of_amax(amax(x) if self._history() else reduced_amax(x, self.groups))

    def scale_of_amax(self, a):
        """The scale to cast a tensor with whose amax is `a` (reduced over its pieces where there is no history
        yet; the weights --fp8-param-gather casts once per step, distributed/fp8_param_gather.py, pass theirs);
        in training `a` joins the step's amaxes."""
        s = self.scale_ if self._history() else scale_from_amax(a, self.dtype, self.margin)
        if self.training:
            self.step_amax = a if self.step_amax is None else torch.maximum(self.step_amax, a)
        return s

    def scales(self, parts, labels, n):
        """As CurrentScaler.scales; with a history each part's amax joins the step's (update() reduces it)."""
        if self._history():
            return [self.scale_of_amax(amax(p)) for p in parts]
        a = reduced_amaxes(parts, labels, n, self.groups)
        return [self.scale_of_amax(a[m]) for m in labels]

    def update(self, step_groups):
        a = torch.zeros_like(self.scale_) if self.step_amax is None else self.step_amax.clone()
        for g in self.groups + tuple(step_groups):
            if g is not None:
                comm.all_reduce_max_(a, g)
        h = torch.roll(self.amax_history, 1)
        h[0] = a
        self.amax_history.copy_(h)
        source = h.max() if self.algo == "max" else h[0]
        self.scale_.copy_(scale_from_amax(source, self.dtype, self.margin))
        self.updates += 1
        self.step_amax, self._has_history = None, True
