"""Activation offload (Megatron-Core's --cpu-offloading): what autograd saves for backward inside an offload
unit goes to host memory during the forward and comes back when its backward asks for it.

A unit is one call TransformerBlock makes for its first N layers: a layer, or a chunk full recompute
checkpoints (then what recompute keeps, the chunk's input, is what goes; its recomputation in the backward
runs outside any unit, so nothing rebuilt there is moved). torch.autograd.graph.saved_tensors_hooks packs
every saved tensor: a storage is copied once per unit and the saved views of it share the copy (the
activation meter, tests/activation_memory.py, counts storages the same way). The unit keeps the original
tensors until it ends, so no storage address is reused inside it; after that only the host copy is held,
by the autograd graph of that micro-batch: a pipeline's in-flight micro-batches each hold their own.

On CUDA the copy runs on a side stream into pinned memory, overlapped with the rest of the forward
(record_stream keeps the device storage until the copy has read it); the reload waits for that copy
and runs on the compute stream when the backward unpacks the tensor. On a CPU the "host copy" is a
second CPU tensor: the same bytes move, so the parity tests prove the mechanism and the meter counts it.
Weights (parameters and views of them, which the model holds anyway) move only with --cpu-offloading-weights.
"""
import contextlib
import weakref

import torch
from torch import nn

from .block import TransformerBlock

_PLAIN = (torch.Tensor, nn.Parameter)  # tensor subclasses (their own storage rules) stay where they are


class _HostCopy:
    """One device storage's bytes on the host; `reloaded`: a weak reference to a tensor rebuilt from it on the
    device, so other saved views of the storage reuse that reload while it lives."""
    __slots__ = ("host", "done", "reloaded", "__weakref__")

    def __init__(self, host, done):
        self.host, self.done, self.reloaded = host, done, None


def is_weight(t, param_storages=()) -> bool:
    """A parameter, a view of one, or a tensor in a parameter's storage (DDP's flat parameter buffers)."""
    return isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) or \
        t.untyped_storage().data_ptr() in param_storages


class ActivationOffloader:
    """Saved-tensor hooks for the offload units of this rank (one object for all its model chunks).

    held / peak: host bytes the hooks hold now / at most since reset_peak() (what left the device)."""

    def __init__(self, device, activations=True, weights=False):
        self.device = torch.device(device)
        self.activations, self.weights = activations, weights
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.held = self.peak = 0
        self.param_storages = set()  # storages of the model's parameters (offload_model): weights, not activations
        self._unit = None  # storage address -> (its _HostCopy, the original tensor) during a unit's forward

    def describe(self) -> str:
        what = " and ".join(k for k, on in (("activations", self.activations), ("weights", self.weights)) if on)
        how = ("pinned host memory, copies on a side CUDA stream overlapped with the forward"
               if self.stream is not None else "a second host tensor (CPU run: the same bytes move)")
        return f"saved {what} of the offloaded layers to {how}"

    def reset_peak(self) -> None:
        self.peak = self.held

    @contextlib.contextmanager
    def unit(self):
        """The saved tensors of what runs inside go to the host (nested units are one unit)."""
        if self._unit is not None:
            yield
            return
        self._unit = {}
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            self._unit = None

    def _takes(self, t) -> bool:
        if type(t) not in _PLAIN or t.device.type != self.device.type or t.numel() == 0 or t.is_conj() or t.is_neg():
            return False
        return self.weights if is_weight(t, self.param_storages) else self.activations

    def _pack(self, t):
        if self._unit is None or not self._takes(t):
            return t
        if is_weight(t, self.param_storages):  # only the tensor itself: its storage may be a whole parameter buffer
            return self._copy(t.detach()), None
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in self._unit:
            self._unit[key] = (self._copy(torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)), t)
        return self._unit[key][0], (t.dtype, t.size(), t.stride(), t.storage_offset())

    def _copy(self, src) -> _HostCopy:
        if self.stream is None:
            entry = _HostCopy(src.clone(), None)
        else:
            host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                host.copy_(src, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self.stream)
            src.record_stream(self.stream)
            entry = _HostCopy(host, done)
        n = src.numel() * src.element_size()
        self.held += n
        self.peak = max(self.peak, self.held)
        weakref.finalize(entry, self._release, n)  # the graph dropped its last saved view: the host bytes go
        return entry

    def _release(self, n) -> None:
        self.held -= n

    def _unpack(self, packed):
        if torch.is_tensor(packed):
            return packed
        entry, view = packed
        back = entry.reloaded() if entry.reloaded is not None else None
        if back is None:
            if self.stream is None:
                back = entry.host
            else:
                torch.cuda.current_stream(self.device).wait_event(entry.done)
                back = entry.host.to(self.device, non_blocking=True)
            if view is None:
                return back
            entry.reloaded = weakref.ref(back)
        if view is None:
            return back
        dtype, size, stride, offset = view
        out = torch.empty(0, dtype=dtype, device=back.device).set_(back.untyped_storage(), offset, size, stride)
        entry.reloaded = weakref.ref(out)
        return out


def offload_model(model, offloader, num_layers) -> int:
    """Offload the first num_layers layers of every TransformerBlock of model (each pipeline chunk has one),
    once its parameters are where they stay (DDP's buffers). -> the layers offloaded on this rank."""
    offloader.param_storages |= {p.untyped_storage().data_ptr() for p in model.parameters()}
    blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
    for b in blocks:
        b.offload_first(offloader, num_layers)
    return sum(min(num_layers, len(b.layers)) for b in blocks)
