"""The zero-bubble split on the autograd graph (pipeline_parallel/backward_split.py), one process, on a
block written with no knowledge of schedules (torch.nn layers): B then W equals the ordinary backward
bit for bit (tests/split_check.py), B releases what only the input gradient needed and W the rest,
reentrant recompute splits too, W accumulates in reverse parameter order, and a custom autograd
function learns which of its gradients each half wants (backward_needs.py)."""
import gc
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from megatron.core.backward_needs import needs_grad
from megatron.core.pipeline_parallel.backward_split import backward_input
from megatron.core.tensor_parallel.random import checkpoint
from tests.split_check import check_split


class Block(nn.Module):
    """A residual MLP block as anyone would write it: plain nn.Linear and nn.LayerNorm."""

    def __init__(self, h=8, f=16, recompute=False):
        super().__init__()
        self.norm, self.fc1, self.fc2, self.recompute = nn.LayerNorm(h), nn.Linear(h, f), nn.Linear(f, h), recompute
        self.kept = {}  # weak references to activations, for the memory test

    def mlp(self, x):
        a = self.fc1(self.norm(x))
        self.kept["gelu_in"] = weakref.ref(a)  # saved by GeLU's backward only: the chain's
        b = F.gelu(a)
        self.kept["fc2_in"] = weakref.ref(b)  # saved by fc2's product: W's weight gradient needs it
        return self.fc2(b)

    def forward(self, x):
        return x + (checkpoint(self.mlp, x) if self.recompute else self.mlp(x))


def _stack(recompute=False):
    torch.manual_seed(0)  # nn's default init draws from the global generator: seed it
    return nn.Sequential(Block(recompute=recompute), Block(recompute=recompute))


def _steps(n=2, loss=False):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 3, 8, generator=g), torch.randn(4, 3, 8, generator=g)) for _ in range(n)]

    def step(m, x, gy):
        inp = x.clone().requires_grad_()
        return ((m(inp) * gy).sum(), None, inp) if loss else (m(inp), gy, inp)
    return [lambda m, x=x, gy=gy: step(m, x, gy) for x, gy in data]


def test_a_block_with_no_knowledge_of_schedules_splits_exactly():
    m = _stack()
    figures = check_split(m, _steps())
    assert figures["b_gemms"] == figures["w_gemms"] == 2 * 4  # per microbatch: 4 input GEMMs, 4 weight GEMMs
    check_split(m, _steps(loss=True))  # the last stage: a scalar loss


def test_reentrant_recompute_splits_its_segment_too():
    figures = check_split(_stack(recompute=True), _steps())
    assert figures["w_gemms"] == 2 * 4


def test_b_releases_what_only_the_input_gradient_needs_and_w_the_rest():
    m = _stack()
    x = torch.randn(4, 3, 8, requires_grad=True)
    out = m(x)
    kept = m[1].kept
    work = backward_input(out, torch.ones_like(out), x, {})
    del out
    gc.collect()
    assert kept["gelu_in"]() is None  # GeLU's saved input: used by B, released after it
    assert kept["fc2_in"]() is not None  # the weight gradient's input: kept for W
    work.run()
    del work
    gc.collect()
    assert kept["fc2_in"]() is None


def test_w_accumulates_in_reverse_parameter_order():
    m = _stack()
    seen = []
    for n, p in m.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, n=n: seen.append(n))
    x = torch.randn(4, 3, 8, requires_grad=True)
    out = m(x)
    backward_input(out, torch.ones_like(out), x, {id(p): i for i, p in enumerate(m.parameters())}).run()
    layers = list(dict.fromkeys(n.rsplit(".", 1)[0] for n, _ in m.named_parameters()))
    # a layer's weight and bias are one group (one autograd node uses both): the groups in reverse
    assert list(dict.fromkeys(n.rsplit(".", 1)[0] for n in seen)) == layers[::-1] and len(seen) == 2 * len(layers)


class _Scale(torch.autograd.Function):
    """y = x * w with a hand-written backward that records what it was asked for."""

    asked = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        wants = (needs_grad(ctx, 0), needs_grad(ctx, 1))
        _Scale.asked.append(wants)
        return (g * w if wants[0] else None), ((g * x).sum(0) if wants[1] else None)


def test_a_custom_function_computes_only_what_each_half_wants():
    w = nn.Parameter(torch.randn(8, generator=torch.Generator().manual_seed(2)))
    x = torch.randn(5, 8, requires_grad=True)
    _Scale.asked.clear()
    out = _Scale.apply(torch.tanh(x), w)
    work = backward_input(out, torch.ones_like(out), x, {})
    assert _Scale.asked == [(True, False)] and w.grad is None
    work.run()
    assert _Scale.asked == [(True, False), (False, True)]
    _Scale.asked.clear()
    _Scale.apply(torch.tanh(x), w).sum().backward()  # an ordinary backward wants both
    assert _Scale.asked == [(True, True)]
