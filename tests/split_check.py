"""B then W (megatron/core/pipeline_parallel/backward_split.py) against the ordinary backward, one process.

check_split(module, steps): each step(module) -> (output, output gradient or None for a scalar loss,
stage input leaf or None) is one microbatch. The steps run twice, each microbatch's backward once
ordinary and once split (B, then W), and every figure must be the same bit for bit: B and W run
autograd's own nodes on the same saved tensors, each parameter's gradient is its ordinary one.
Checked per microbatch: B changes no parameter's .grad and fires no post-accumulate-grad hook (DDP's)
and gives the input gradient; W fires each parameter's hook once and no other; B's and W's matrix
products together are the ordinary backward's (nothing computed twice, but where a parameter is used at
two depths of a stage).

fusion=True runs both with gradient-accumulation fusion (tensor_parallel/wgrad_fusion.py) against a
Sink that keeps DDP's side of the grad-sink contract: the fused layers add into its fp32 buffers and
call grad_added, every other gradient comes through .grad and the post-accumulate-grad hook. A
parameter's gradient is then its buffer, and "its hook fires" is its gradient arriving either way. A
hook that torch fires for a fused weight with no .grad (its function returned None) is no arrival:
allowed in W only, at most once per microbatch."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.core.pipeline_parallel.backward_split import backward_input
from megatron.core.tensor_parallel.param_meta import set_grad_sink

_GEMMS = {"mm", "addmm", "addmm_", "bmm", "baddbmm", "addbmm", "_grouped_mm", "wgrad_accumulate"}


class Gemms(TorchDispatchMode):
    """Counts the matrix products run inside."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ in _GEMMS
        return func(*args, **(kwargs or {}))


class Sink:
    """DDP's side of the grad-sink contract (distributed/ddp.py) over fp32 buffers: calls counts each
    parameter's arrivals, empty the hook firings that found no .grad."""

    def __init__(self, module):
        self.names = {id(p): n for n, p in module.named_parameters()}
        self.main = {n: torch.zeros(p.shape, dtype=torch.float32) for n, p in module.named_parameters()}
        self.calls, self.empty, self.hooked = {}, {}, set()

    def grad_target(self, p):
        return self.main[self.names[id(p)]]

    def grad_is_first(self, p):  # the buffers start zeroed: every gradient adds
        return False

    def grad_added(self, p):
        n = self.names[id(p)]
        self.calls[n] = self.calls.get(n, 0) + 1

    def on_grad(self, p):
        if p.grad is None:
            n = self.names[id(p)]
            self.empty[n] = self.empty.get(n, 0) + 1
            return
        self.grad_target(p).add_(p.grad)
        p.grad = None
        self.hooked.add(self.names[id(p)])
        self.grad_added(p)

    def clear(self):
        for t in self.main.values():
            t.zero_()
        self.calls.clear()
        self.empty.clear()
        self.hooked.clear()


def _hooks(module, calls, sink):
    if sink is not None:
        for p in module.parameters():
            set_grad_sink(p, sink)
        return [p.register_post_accumulate_grad_hook(sink.on_grad) for p in module.parameters()]
    return [p.register_post_accumulate_grad_hook(lambda p, n=n: calls.__setitem__(n, calls.get(n, 0) + 1))
            for n, p in module.named_parameters()]


def _gradients(module, sink):
    if sink is not None:
        return {n: t.clone() for n, t in sink.main.items() if sink.calls.get(n)}
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def check_split(module, steps, reruns=0, fusion=False):
    """reruns: GEMMs per microbatch W runs again (a parameter used at two depths). fusion: with
    gradient-accumulation fusion (the module docstring). Returns {"b_gemms": ..., "w_gemms": ...,
    "input_grads": [...], "fused": names of the parameters whose gradient never reached .grad}."""
    params = dict(module.named_parameters())
    order = {id(p): i for i, p in enumerate(params.values())}
    module.zero_grad(set_to_none=True)
    sink = Sink(module) if fusion else None
    calls = sink.calls if fusion else {}
    want_in, want_gemms = [], []
    handles = _hooks(module, calls, sink)

    def _grads(module):
        return _gradients(module, sink)
    try:
        for step in steps:
            out, grad, inp = step(module)
            with Gemms() as g:
                out.backward(grad)
            want_gemms.append(g.count)
            want_in.append(None if inp is None else inp.grad.clone())
        want, want_calls = _grads(module), dict(calls)
        module.zero_grad(set_to_none=True)
        calls.clear()
        if sink is not None:
            sink.clear()
        figures = {"b_gemms": 0, "w_gemms": 0, "input_grads": []}
        for i, step in enumerate(steps):
            out, grad, inp = step(module)
            before = _grads(module)
            with Gemms() as b:
                work = backward_input(out, grad, inp, order)
            del out
            assert all(c == i for c in calls.values()), f"hooks fired in B: {calls}"
            if sink is not None:
                assert all(c == i for c in sink.empty.values()), f"hooks fired in B: {sink.empty}"
            now = _grads(module)
            changed = [n for n in params
                       if (n in now) != (n in before) or n in now and not torch.equal(now[n], before[n])]
            assert not changed, f"computed in B: {changed}"
            if inp is not None:
                assert torch.equal(inp.grad, want_in[i]), "B's input gradient differs from the ordinary backward's"
                figures["input_grads"].append(inp.grad)
            with Gemms() as w:
                work.run()
            wrong = sorted(n for n in params if calls.get(n, 0) != i + 1 and want_calls.get(n, 0) == i + 1)
            assert not wrong, f"no gradient, or more than one, in W: {wrong}"
            if sink is not None:
                assert all(c <= i + 1 for c in sink.empty.values()), f"hooks fired twice in W: {sink.empty}"
            assert b.count + w.count == want_gemms[i] + reruns, \
                f"B {b.count} + W {w.count} GEMMs, ordinary {want_gemms[i]}"
            figures["b_gemms"] += b.count
            figures["w_gemms"] += w.count
        assert calls == want_calls, (calls, want_calls)
        got = _grads(module)
        assert sorted(got) == sorted(want)
        for n in want:
            assert torch.equal(got[n], want[n]), f"{n}: max difference {(got[n] - want[n]).abs().max():.3e}"
        if sink is not None:
            figures["fused"] = sorted(n for n in calls if n not in sink.hooked)
    finally:
        for h in handles:
            h.remove()
        if sink is not None:
            for p in params.values():
                set_grad_sink(p, None)
    return figures
