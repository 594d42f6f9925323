"""Which gradients the backward running now uses, for custom autograd functions.

ctx.needs_input_grad says whether an input could take a gradient; autograd's own functions also skip
an output no edge of the running backward leads to (a backward restricted by inputs=..., as the
zero-bubble B and W of pipeline_parallel/backward_split.py are: B wants no weight gradient, W no input
gradient). needs_grad gives a custom function's backward the same answer, so it can skip that work too.
"""
import torch

_will_execute = getattr(torch._C, "_will_engine_execute_node", None)


def needs_grad(ctx, i: int) -> bool:
    """Whether input i of the custom function whose backward is running (ctx) gets a gradient that
    the running backward uses. Call it only inside that backward. Autograd keeps edges for the inputs
    that are tensors only (not for None or other values): i must count those, so a function that uses
    this takes its tensor inputs first and its other arguments after them."""
    if not ctx.needs_input_grad[i]:
        return False
    node = ctx.next_functions[i][0]
    if node is None:
        return False
    try:
        return _will_execute is None or _will_execute(node)
    except RuntimeError:  # torch cannot tell for a leaf under autograd.grad(): compute it
        return True
