"""One stage's backward in two, on its autograd graph, for the zero-bubble schedules (zero_bubble.py,
zb_v.py): B, the stage input's gradient, which the previous stage waits for; W, the weight gradients,
later. Layers know nothing of it: whatever autograd records splits.

B (backward_input) walks the graph below the stage output once. The nodes that lead to the stage input
are the input-gradient chain; the backward runs restricted to the input (backward(inputs=...)), so
autograd computes a node's outputs only along chain edges: a linear's input-gradient GEMM runs, its
weight-gradient GEMM does not. A chain node with an edge out of the chain (into nodes that lead to
parameters only: a weight's transpose, its AccumulateGrad) is a source; a pre-hook keeps the gradient it
receives. The graph is kept, but the saved tensors of the chain nodes W does not run are released then.

W (WeightWork.run): per group of sources that share parameters, a backward from the kept gradients into
those parameters alone: autograd runs each source again only for its parameter edges (the weight GEMM),
then the parameter-only nodes, then each parameter's AccumulateGrad once, so .grad and the
post-accumulate-grad hooks (DDP's main_grad, bucket counting and overlapped reduction, ZeRO's sharded
buffers) see one gradient per microbatch, as after an ordinary backward. The groups run in the reverse
order of the chunk's parameters, the same on every rank: what the sources or hooks communicate in W is
in the same order everywhere.

Without a stage input that needs a gradient (the first stage) B has nothing to compute and W is the
whole backward. A parameter used at two depths of one stage (one source's chain leads to another source
of its group) makes W run the chain between the uses again; pre-hooks hold every source to its kept
gradient, so the result is exact. Tensor hooks on a source's output run again in W (ZeRO-3's gather is
idempotent); their effect on the value does not (the pre-hook comes after them).

Reentrant backward code (activation recompute, tensor_parallel.random.CheckpointFunction) has a
`backward_runner` attribute on its autograd node: B sets it, so the recomputed segment's backward is a
nested B whose W joins this one's.
"""
import contextlib
import gc

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

_engine = torch.autograd.Variable._execution_engine
# node type -> its _raw_saved_* attributes: a cache of dir(), bounded by the autograd node types torch defines
# (a fixed set), and the same for every caller
_saved_names = {}


@contextlib.contextmanager
def _no_cycle_collection():
    """The walk allocates many short-lived objects, freed by reference counting; a cycle collection
    they would trigger scans the whole heap (the model's graph included) for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _run(roots, grads, inputs, keep):
    """The autograd engine from GradientEdge roots with grads, accumulating into inputs only (no shape
    check against the root tensors: a sent output's storage is freed, p2p.free_output)."""
    _engine.run_backward(tensors=tuple(roots), grad_tensors=tuple(grads), keep_graph=keep, create_graph=False,
                         inputs=tuple(inputs), allow_unreachable=True, accumulate_grad=True)


def _walk(roots):
    """({node: [next nodes]} below roots in discovery order, {node: [nodes with an edge to it]})."""
    below, above, stack = {}, {}, list(roots)
    while stack:
        n = stack.pop()
        if n in below:
            continue
        below[n] = nexts = [f for f, _ in n.next_functions if f is not None]
        for f in nexts:
            above.setdefault(f, []).append(n)
            if f not in below:
                stack.append(f)
    return below, above


def _closure(starts, edges, inside=None):
    """Nodes reachable from starts along edges ({node: [nodes]}), within `inside` if given."""
    seen, stack = set(), list(starts)
    while stack:
        n = stack.pop()
        if n not in seen and (inside is None or n in inside):
            seen.add(n)
            stack += edges.get(n, ())
    return seen


def _drop(_):
    return None


def _gone(_):
    raise RuntimeError("zero-bubble B released this saved tensor, but W needs it (backward_split.py)")


def _release(node):
    """Drop the tensors node saved for its backward (it will not run again)."""
    names = _saved_names.get(type(node))
    if names is None:
        names = _saved_names[type(node)] = [a for a in dir(node) if a.startswith("_raw_saved_")]
    for name in names:
        saved = getattr(node, name)
        for s in saved if isinstance(saved, (tuple, list)) else (saved,):
            with contextlib.suppress(RuntimeError, AttributeError):  # undefined, or hooked already
                s.register_hooks(_drop, _gone)


class _Group:
    """Sources (node, gradients it received in B) and the leaves their parameter edges reach."""

    def __init__(self):
        self.sources, self.leaves, self.key = [], [], -1

    def run(self, keep, before):
        roots, grads = [], []
        for node, received in self.sources:
            for i, g in enumerate(received):
                if g is not None:
                    roots.append(GradientEdge(node, i))
                    grads.append(g)
        if not roots:
            return
        if before is not None:
            before([leaf.variable for leaf in self.leaves])
        # each source holds its kept gradient, whatever else reaches it in W (another use of a parameter)
        hooks = [node.register_prehook(lambda _, g=received: g) for node, received in self.sources]
        try:
            _run(roots, grads, [leaf.variable for leaf in self.leaves], keep)
        finally:
            for h in hooks:
                h.remove()


class WeightWork:
    """What one B keeps for its W. order: {id(parameter): index} of the chunk's parameters."""

    def __init__(self, order):
        self.order, self.groups, self.keep = order, [], False

    def run(self, before=None):
        """W: the weight gradients, accumulated once per parameter (its hooks fire then). before: called
        with each group's parameters first (DistributedDataParallel.before_weight_grads)."""
        groups, self.groups = sorted(self.groups, key=lambda g: -g.key), []
        with _no_cycle_collection():
            for g in groups:
                g.run(self.keep, before)

    def held(self):
        """(source nodes, kept gradients): what this work keeps alive (bench/pipeline_memory.py)."""
        return ([n for g in self.groups for n, _ in g.sources],
                [t for g in self.groups for _, r in g.sources for t in r if t is not None])

    def nested(self, outputs, grads, inputs):
        """backward_runner of reentrant code: B of outputs (with grads) into inputs, W joining this one's."""
        self.split([get_gradient_edge(o) for o in outputs], list(grads), inputs)

    def split(self, roots, grads, inputs):
        """B from GradientEdge roots with grads into inputs (leaf tensors): their .grad accumulates now,
        the rest becomes groups of this work."""
        below, above = _walk([e.node for e in roots])
        accs = {get_gradient_edge(t).node: t for t in inputs if t.requires_grad}
        chain = _closure([a for a in accs if a in below], above)
        sources = {n: None for n in below if n in chain and any(f not in chain for f in below[n])}
        runners = [n for n in chain if hasattr(n, "backward_runner")]
        hooks = [n.register_prehook(_keeper(sources, n)) for n in sources]
        for n in runners:
            n.backward_runner = self.nested
        try:
            if chain:
                _run([e for e in roots if e.node in chain], [g for e, g in zip(roots, grads) if e.node in chain],
                     [t for a, t in accs.items() if a in chain], keep=True)
        finally:
            for h in hooks:
                h.remove()
            for n in runners:  # W runs it again only between two uses of a parameter: input gradients then
                n.backward_runner = inputs_only
        started = {n: g for n, g in sources.items() if g is not None}
        for e, g in zip(roots, grads):  # a root outside the chain (no stage input): W starts there
            if e.node not in chain:
                got = list(started.get(e.node, [None] * len(e.node._input_metadata)))
                got[e.output_nr] = g if got[e.output_nr] is None else got[e.output_nr] + g
                started[e.node] = tuple(got)
        self._group(below, chain, started)

    def _group(self, below, chain, sources):
        """Sources that reach a node outside the chain in common form one group; release the saved
        tensors of the chain nodes W does not run."""
        reached, parent = {}, {s: s for s in sources}  # node outside the chain -> a source reaching it

        def find(s):
            while parent[s] is not s:
                parent[s] = s = parent[parent[s]]
            return s

        for s in sources:
            stack = [s] if s not in chain else [f for f in below[s] if f not in chain]
            while stack:
                n = stack.pop()
                if n in reached:
                    parent[find(reached[n])] = find(s)
                    continue
                reached[n] = s
                stack += below[n]  # outside the chain all the way down
        groups = {}
        for s, received in sources.items():
            groups.setdefault(find(s), _Group()).sources.append((s, received))
        for n, s in reached.items():
            if not below[n] and hasattr(n, "variable"):  # a leaf: AccumulateGrad
                g = groups[find(s)]
                g.leaves.append(n)
                g.key = max(g.key, self.order.get(id(n.variable), -1))
        keep = set(sources)
        for g in groups.values():
            ins = {n for n, _ in g.sources if n in chain}
            if len(ins) > 1:  # W runs the chain between two sources of one group again
                between = _closure(ins, below, chain) & _closure(ins, _reverse(below, chain), chain)
                self.keep |= len(between) > len(ins)  # that chain may hold another group's sources
                keep |= between
        for n in chain - keep:
            _release(n)
        self.groups += [g for g in groups.values() if g.leaves]


def _keeper(sources, node):
    def hook(grads):
        sources[node] = grads
    return hook


def inputs_only(outputs, grads, inputs):
    """backward_runner outside B: the backward of outputs into inputs' .grad alone."""
    _run([get_gradient_edge(o) for o in outputs], list(grads), list(inputs), keep=False)


def _reverse(below, inside):
    above = {}
    for n in inside:
        for f in below.get(n, ()):
            above.setdefault(f, []).append(n)
    return above


def backward_input(output, grad, stage_input, order) -> WeightWork:
    """B of one microbatch-chunk: output [any] (the scaled loss when grad is None) backpropagated into
    stage_input's .grad only (None, or not requiring grad: nothing to compute now). Returns the work for
    W. order: {id(parameter): index} of the chunk's parameters (W's order)."""
    work = WeightWork(order)
    if grad is None:
        grad = torch.ones_like(output) if output.numel() == 1 else None
    with _no_cycle_collection():
        work.split([get_gradient_edge(output)], [grad], [stage_input] if stage_input is not None else [])
    return work
