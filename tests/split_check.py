"""B then W (megatron/core/pipeline_parallel/backward_split.py) against the ordinary backward, one process.

check_split(module, steps): each step(module) -> (output, output gradient or None for a scalar loss,
stage input leaf or None) is one microbatch. The steps run twice, each microbatch's backward once
ordinary and once split (B, then W), and every figure must be the same bit for bit: B and W run
autograd's own nodes on the same saved tensors, each parameter's gradient is its ordinary one.
Checked per microbatch: B changes no parameter's .grad and fires no post-accumulate-grad hook (DDP's)
and gives the input gradient; W fires each parameter's hook once and no other; B's and W's matrix
products together are the ordinary backward's (nothing computed twice, but where a parameter is used at
two depths of a stage)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.core.pipeline_parallel.backward_split import backward_input

_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_grouped_mm"}


class Gemms(TorchDispatchMode):
    """Counts the matrix products run inside."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ in _GEMMS
        return func(*args, **(kwargs or {}))


def _hooks(module, calls):
    return [p.register_post_accumulate_grad_hook(lambda p, n=n: calls.__setitem__(n, calls.get(n, 0) + 1))
            for n, p in module.named_parameters()]


def _grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def check_split(module, steps, reruns=0):
    """reruns: GEMMs per microbatch W runs again (a parameter used at two depths).
    Returns {"b_gemms": ..., "w_gemms": ..., "input_grads": [...]} over the steps."""
    params = dict(module.named_parameters())
    order = {id(p): i for i, p in enumerate(params.values())}
    module.zero_grad(set_to_none=True)
    calls, want_in, want_gemms = {}, [], []
    handles = _hooks(module, calls)
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
        figures = {"b_gemms": 0, "w_gemms": 0, "input_grads": []}
        for i, step in enumerate(steps):
            out, grad, inp = step(module)
            before = _grads(module)
            with Gemms() as b:
                work = backward_input(out, grad, inp, order)
            del out
            assert all(c == i for c in calls.values()), f"hooks fired in B: {calls}"
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
            assert b.count + w.count == want_gemms[i] + reruns, \
                f"B {b.count} + W {w.count} GEMMs, ordinary {want_gemms[i]}"
            figures["b_gemms"] += b.count
            figures["w_gemms"] += w.count
        assert calls == want_calls, (calls, want_calls)
        got = _grads(module)
        assert sorted(got) == sorted(want)
        for n in want:
            assert torch.equal(got[n], want[n]), f"{n}: max difference {(got[n] - want[n]).abs().max():.3e}"
    finally:
        for h in handles:
            h.remove()
    return figures
