"""A dispatch-mode record of the aten operators a piece of code runs, for tests that count passes."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpRecord(TorchDispatchMode):
    """with OpRecord() as r: ...  -> r.calls: [(operator name, [output tensors])] in call order."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        self.calls.append((func.overloadpacket.__name__, [o for o in outs if isinstance(o, torch.Tensor)]))
        return out

    def names(self):
        return [name for name, _ in self.calls]
