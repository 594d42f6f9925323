"""Per-module FLOPs and time of the code run inside `ModuleFlops(model, device)`, measured op by op.

Every aten op goes through a TorchDispatchMode: the matrix products (mm, addmm, bmm, baddbmm, the
grouped and FP8 GEMMs, scaled-dot-product attention) count 2 FLOPs per multiply-add, what flops.py's
model FLOPs count, and every op's time (the CPU clock, or CUDA events on a GPU) goes to the modules
running it. Nothing else counts: norms, softmax and element-wise ops are not model FLOPs.

Which modules are running: forward hooks on the model's modules (a stack); in the backward, those
whose forward created the autograd node that runs (the nodes a module's forward adds are labelled
when it returns). Attention's backward counts twice its forward, as the model
FLOPs do: a fused kernel's recomputation of the scores is hardware work, not model FLOPs. A forward
run during the backward (activation recompute) is counted apart, as recompute.
"""
import functools
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

KINDS = ("forward", "backward", "recompute")
_LABEL = "megatron flops profiler: modules"
_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_fused_attention_overrideable")


def _gemm(a, b):
    """2 m k n of a [.., m, k] x [.., k, n] product, leading dimensions as a batch."""
    batch = a.shape[:-2].numel() if a.dim() > 2 else (b.shape[:-2].numel() if b.dim() > 2 else 1)
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _grouped(a, b):
    # 2D x 3D: every row of a through its group's [k, n]; 2D x 2D: the groups split the contracted rows
    if a.dim() == 2 and b.dim() == 3:
        return 2 * a.shape[0] * a.shape[1] * b.shape[2]
    return _gemm(a, b)


def _attention(q, k, v, width):
    """Scores and weighted values over the full s x s square (flops.py's count): q [b, n, s, dq], v [b, g, s, dv];
    width(t): t's head size before zero columns were added for the kernel (multi-latent attention's v)."""
    b, n, sq, _ = q.shape
    return 2 * b * n * sq * k.shape[-2] * (min(width(q), width(k)) + width(v))


def _name(func):
    return func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)


def op_flops(func, args, width=lambda t: t.shape[-1]) -> int:
    """Model FLOPs of one aten op call (0 for ops that are not matrix products)."""
    name = _name(func)
    if name in ("mm", "bmm", "_scaled_mm"):
        return _gemm(args[0], args[1])
    if name in ("addmm", "addmm_", "baddbmm", "baddbmm_", "_addmm_activation"):
        return _gemm(args[1], args[2])
    if name == "_grouped_mm":
        return _grouped(args[0], args[1])
    if name in _ATTENTION:
        return _attention(*args[:3], width)
    if name.endswith("_backward") and name[:-len("_backward")] in _ATTENTION:
        return 2 * _attention(*args[1:4], width)  # (grad_out, q, k, v, ...): dQ, dK, dV and dP, twice the forward
    return 0


def _requiring_grad(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.requires_grad]


class _Tracker:
    """Which of the model's modules run now, by their path (named_modules; the root is `root`). In the
    forward, a stack kept by forward hooks; in the backward, the autograd node running: each module's
    forward labels the nodes it created (node.metadata, freed with the graph) with the modules it ran in."""

    def __init__(self, model, root):
        self.forward, self.inputs, self.handles = [], [], []
        for name, module in model.named_modules():
            path = f"{root}.{name}" if name else root
            self.handles.append(module.register_forward_pre_hook(functools.partial(self._enter, path)))
            self.handles.append(module.register_forward_hook(functools.partial(self._exit, path)))

    def _enter(self, path, module, args):
        self.forward.append(path)
        self.inputs.append({id(t.grad_fn) for t in _requiring_grad(args) if t.grad_fn is not None})

    def _exit(self, path, module, args, output):
        if not self.forward or self.forward[-1] != path:
            return
        self.forward.pop()
        boundary = self.inputs.pop()
        if torch.is_grad_enabled():
            self._label([t.grad_fn for t in _requiring_grad(output) if t.grad_fn is not None], boundary,
                        (*self.forward, path))

    @staticmethod
    def _label(todo, boundary, stack):
        """Label the nodes between the module's outputs and its inputs that no module inside it labeled."""
        path, seen = stack[-1], set(boundary)
        while todo:
            node = todo.pop()
            if id(node) in seen or type(node).__name__ == "AccumulateGrad":
                continue
            seen.add(id(node))
            label = node.metadata.get(_LABEL)
            if label is None:
                node.metadata[_LABEL] = stack
            elif path not in label:
                continue  # an earlier module's node: the graph before this module's inputs
            todo.extend(f for f, _ in node.next_functions if f is not None)

    def where(self):
        """(kind, the module paths running) for the op about to run."""
        node = torch._C._current_autograd_node()
        if node is None:
            return "forward", tuple(self.forward)
        if self.forward:  # a forward inside the backward: activation recompute
            return "recompute", tuple(self.forward)
        return "backward", node.metadata.get(_LABEL, ())

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []


# ops that pass a zero-padded head dimension on unchanged (the attention core's layout changes)
_KEEPS_WIDTH = frozenset({"permute", "transpose", "view", "_unsafe_view", "reshape", "clone", "contiguous", "expand",
                "unsqueeze", "squeeze", "detach", "alias", "_to_copy", "as_strided", "select", "slice"})


class _Counting(TorchDispatchMode):

    def __init__(self, tracker, record):
        super().__init__()
        self.tracker, self.record = tracker, record
        self.widths = WeakIdKeyDictionary()  # tensor -> its last dimension before zero padding

    def _width(self, t):
        return self.widths.get(t, t.shape[-1])

    def _track_padding(self, name, args, out):
        if not isinstance(out, torch.Tensor) or not args or not isinstance(args[0], torch.Tensor):
            return
        if name == "constant_pad_nd":
            pad, value = args[1], args[2] if len(args) > 2 else 0
            if value == 0 and len(pad) == 2 and pad[0] == 0:
                self.widths[out] = self._width(args[0])
        elif name in _KEEPS_WIDTH and args[0] in self.widths and out.shape[-1] == args[0].shape[-1]:
            self.widths[out] = self.widths[args[0]]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind, paths = self.tracker.where()
        flops = op_flops(func, args, self._width)
        started = self.record.start()
        out = func(*args, **(kwargs or {}))
        self.record.add(started, kind, paths, flops)
        self._track_padding(_name(func), args, out)
        return out


class ModuleFlops:
    """Context manager over the code to measure. After it: flops[path][kind], seconds[path][kind]
    (each module's including its children's), total_flops[kind] (every op's, in a module or not)."""

    def __init__(self, model, device, root="model"):
        self.model, self.root, self.cuda = model, root, torch.device(device).type == "cuda"
        self.flops, self.seconds = {}, {}
        self.total_flops = dict.fromkeys(KINDS, 0)
        self._events = []

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, started, kind, paths, flops):
        if self.cuda:  # read once the step is done (events are asynchronous)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((started, end, kind, paths))
        else:
            self._time(time.perf_counter() - started, kind, paths)
        self.total_flops[kind] += flops
        for path in paths:
            counts = self.flops.setdefault(path, dict.fromkeys(KINDS, 0))
            counts[kind] += flops

    def _time(self, seconds, kind, paths):
        for path in paths:
            self.seconds.setdefault(path, dict.fromkeys(KINDS, 0.0))[kind] += seconds

    def __enter__(self):
        self._tracker = _Tracker(self.model, self.root)
        self._mode = _Counting(self._tracker, self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self._tracker.remove()
        if self.cuda:
            torch.cuda.synchronize()
            for start, end, kind, paths in self._events:
                self._time(start.elapsed_time(end) / 1e3, kind, paths)
            self._events = []
        return False

    def parameters(self):
        """{path: this rank's parameter count of the module and its children}."""
        return {(f"{self.root}.{name}" if name else self.root): sum(p.numel() for p in m.parameters())
                for name, m in self.model.named_modules()}
