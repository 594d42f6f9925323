"""--compile-layers: each transformer layer under torch.compile (torchtitan's regional compile), not the
whole model. One layer's graph is compiled once and reused by every layer of the same shape (dynamo
lifts the parameters to graph inputs), so compile time grows with the kinds of layers, not their count.

What is inside a compiled region and what is not (docs/kernels.md, "Compiled layers"):
- a dense layer whole (norms, attention, MLP, residual adds); an MoE layer's attention part only: the
  router, the token dispatch and the experts run eager (their shapes depend on the routing);
- module hooks stay outside (TransformerLayer.forward is eager and calls the compiled function);
- our csrc kernels step aside for inductor inside a region (fusions._common.csrc_ok_for: a pybind call
  would break the graph, and inductor fuses the same element-wise work with its neighbours); the
  fronts' compiled functions are inlined into the layer's graph;
- a TP / SP collective (an autograd.Function around a c10d call) is a graph break: dynamo's counters
  say how many, logged once after the first forward (compile_report).
"""
import torch

from .layer import TransformerLayer


def compile_layers(model, fullgraph=False):
    """Put every TransformerLayer of `model` (a module or a list of pipeline chunks) under torch.compile
    with static shapes. -> the number of layers compiled."""
    n = 0
    for module in model.modules():
        if isinstance(module, TransformerLayer):
            module.compile_regions(lambda fn: torch.compile(fn, dynamic=False, fullgraph=fullgraph))
            n += 1
    return n


def graph_breaks():
    """{reason: count} of dynamo's graph breaks so far in this process."""
    from torch._dynamo.utils import counters
    return dict(counters["graph_break"])


def _short(reason):
    """A graph break's reason in a few words: what dynamo stopped at (the operator kind, the explanation)."""
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    kind = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Higher Order Operator:")), None)
    first = lines[0] if lines else ""
    why = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Explanation:")), first)
    why = why.split(" This function")[0][:90]
    return f"{kind}: {why}" if kind else why


def compile_report(num_layers, device):
    """The start-up line after the first compiled forward (this rank's): layers, graphs, graph breaks and
    their reasons."""
    from torch._dynamo.utils import counters
    breaks = graph_breaks()
    total = sum(breaks.values())
    graphs = counters["stats"].get("unique_graphs", 0)
    reasons = "; ".join(f"{n} x {_short(r)}" for r, n in sorted(breaks.items(), key=lambda kv: -kv[1]))
    backend = "inductor: triton kernels" if torch.device(device).type == "cuda" else "inductor: C++ on the CPU"
    return (f"> compiled layers: {num_layers} transformer layers under torch.compile ({backend}; csrc kernels step "
            f"aside inside them), {graphs} graphs, "
            f"{total} graph breaks" + (f" ({reasons})" if reasons else ""))
