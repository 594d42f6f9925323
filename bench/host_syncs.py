"""Host synchronisations and aten ops of eager PyTorch code, counted on the CPU as CUDA would pay them.

    with HostSyncs() as c:
        step()
    c.syncs    # {"aten.nonzero": 2, "Tensor.tolist": 6, ...}: what would make the host wait for the GPU
    c.ops      # aten ops dispatched (views included: each costs host time)
    c.where    # {kind: [file:line of the caller outside torch, ...]}: who asked

On a GPU a host synchronisation drains the stream: the host waits until the queued kernels have
run, then launches the next ones while the GPU idles. At small shapes that idle time is the step.
What synchronises on CUDA (and is counted here, though the CPU never waits):
- a value read on the host: .item(), int()/float()/bool() of a tensor (aten._local_scalar_dense),
  .tolist() and .numpy() (not aten ops: the methods are wrapped while counting);
- an output whose size depends on values: nonzero (torch.where(c), argwhere), masked_select, boolean
  indexing (aten.index / index_put_ with a bool index), unique, repeat_interleave with tensor
  repeats and no output_size, bincount (CUDA reads min and max first), histc with a range of (0, 0),
  one_hot without num_classes;
- Python data to the device (torch.tensor(list), torch.as_tensor(float), aten.lift_fresh): on CUDA
  a copy from pageable memory that waits for the stream;
- aten.equal / allclose (a bool on the host).
"""
import collections
import os
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_ALWAYS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.bincount, aten._unique2,
           aten._unique, aten.unique_consecutive, aten.unique_dim, aten.unique_dim_consecutive, aten.equal,
           aten.lift_fresh, aten.lift_fresh_copy}
_BOOL_INDEXED = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
_HOST_READS = ("tolist", "numpy")
_OWN = os.sep + "torch" + os.sep


def syncing(func, args, kwargs):
    """Whether aten op `func` called with (args, kwargs) waits for the GPU on CUDA."""
    packet = func.overloadpacket
    if packet in _ALWAYS:
        return True
    if packet in _BOOL_INDEXED:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    if func in (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor):
        return kwargs.get("output_size") is None
    if packet is aten.histc:
        bounds = list(args[2:4]) + [kwargs.get("min", 0), kwargs.get("max", 0)][len(args[2:4]):]
        return bounds[0] == bounds[1] == 0
    return False


def _caller():
    """file:line of the innermost frame outside torch (the code that asked)."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if _OWN not in frame.filename and not frame.filename.endswith("host_syncs.py"):
            return f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    return "?"


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.owner.ops[str(func.overloadpacket)] += 1
        if syncing(func, args, kwargs):
            self.owner._sync(f"aten.{func.overloadpacket.__name__}")
        return func(*args, **kwargs)


def _counted(owner, name, method):
    def read_on_host(self, *args, **kwargs):
        owner._sync(f"Tensor.{name}")
        return method(self, *args, **kwargs)
    return read_on_host


class HostSyncs:
    """Context manager counting, while active, the aten ops dispatched and the host syncs CUDA would make.
    where=True records the caller of each sync (slower: a stack walk per sync)."""

    def __init__(self, where=True):
        self.ops, self.syncs = collections.Counter(), collections.Counter()
        self.where = collections.defaultdict(collections.Counter)
        self._record_where = where
        self._mode = _Dispatch(self)
        self._saved = {}

    def _sync(self, kind):
        self.syncs[kind] += 1
        if self._record_where:
            self.where[kind][_caller()] += 1

    @property
    def total_syncs(self):
        return sum(self.syncs.values())

    @property
    def total_ops(self):
        return sum(self.ops.values())

    def __enter__(self):
        # not aten ops, and __torch_function__ modes do not reach backward: the methods are wrapped
        for name in _HOST_READS:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, _counted(self, name, self._saved[name]))
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        return False

    def report(self, top=20):
        """Lines: each sync kind with its callers, the most frequent first."""
        lines = []
        for kind, n in self.syncs.most_common():
            callers = ", ".join(f"{c} x{k}" for c, k in self.where[kind].most_common(top))
            lines.append(f"{kind}: {n}" + (f" ({callers})" if callers else ""))
        return lines
