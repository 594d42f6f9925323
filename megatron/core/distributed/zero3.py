"""ZeRO-3 (--data-parallel-sharding-strategy optim_grads_params): gather each unit's parameters
just before its forward and again before its backward, release them after.

A unit is what FSDP would wrap: every module that is an element of an nn.ModuleList (the
transformer layers), and per model chunk one root unit with the rest of its parameters
(embeddings, final norm, output layer). The root unit is gathered for the chunk's whole forward,
and in backward from the chunk's output until its last gradient: that is how a tied word table,
used by the embedding and by the output layer of one chunk, is there for both uses. Each unit is
one bucket of each sharded_buffer.ShardedBuffer holding some of its parameters (unit_layout): a MoE
layer's experts are in a buffer of their own, gathered over the expert-data-parallel group.

Working set per rank: the root unit of the chunk being run plus one layer (two with
--overlap-param-gather, which starts the next unit's gather while the current one computes:
the next layer in forward, the previous one in backward).

Traffic per step, per bucket of P parameter elements over d ranks (a MoE layer's experts: the
expert-DP size): an all-gather of P (d-1)/d before each
forward and each backward of every microbatch, one reduce-scatter of the gradient per step:
3 P (d-1)/d without accumulation; each further microbatch adds 2 P (d-1)/d (parameters are not
kept gathered across microbatches).
"""
import torch
from torch import nn

from .. import comm
from .sharded_buffer import allocate, is_allocated, release


def units(module):
    """Per model chunk, [(module, parameters)] of its root unit then its layer units, in forward
    order; parameters: those with requires_grad, registration order. Units without any are left out.
    module: one chunk or an nn.ModuleList of chunks."""
    chunks = list(module) if isinstance(module, nn.ModuleList) else [module]
    out = []
    for chunk in chunks:
        layers, inside = [], set()
        for lst in chunk.modules():  # pre-order: an outer list's elements are units, not an inner one's
            if isinstance(lst, nn.ModuleList) and id(lst) not in inside:
                layers += list(lst)
                inside |= {id(m) for layer in lst for m in layer.modules()}
        in_layers = {id(p) for m in layers for p in m.parameters()}
        found = [(chunk, [p for p in chunk.parameters() if p.requires_grad and id(p) not in in_layers])]
        found += [(m, [p for p in m.parameters() if p.requires_grad]) for m in layers]
        out.append([(m, ps) for m, ps in found if ps])
    return out


def layout_units(chunk_units, params):
    """The units' parameters among `params` (one dtype), in buffer order: the last unit first and
    within a unit the last parameter first (backward order), empty units left out."""
    mine = {id(p) for p in params}
    per_unit = [[p for p in reversed(ps) if id(p) in mine] for chunk in reversed(chunk_units)
                for _, ps in reversed(chunk)]
    return [ps for ps in per_unit if ps]


def working_set(chunk_sizes, prefetch):
    """Largest set of full parameters gathered at once, in the unit of chunk_sizes (elements or bytes):
    over the chunks, the root unit plus the largest layer unit (the two largest with prefetch).
    chunk_sizes: per chunk, the padded sizes of its units in forward order, root first."""
    return max((sizes[0] + sum(sorted(sizes[1:], reverse=True)[:2 if prefetch else 1])
                for sizes in chunk_sizes), default=0)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


class ParamGatherer:
    """Forward and backward hooks that gather and release the units' buckets, each over its own
    bucket.group (groups.dp_cp for dense parameters, groups.edp for MoE experts').

    chunk_units: per model chunk, [(module, buckets)] in forward order, its root unit first; a unit
    has one bucket per buffer holding some of its parameters (a MoE layer: dense and expert).
    targets: {id(bucket): (full, shard)} of buckets gathered from another shard into another full tensor
    than their parameters' (--fp8-param-gather's FP8 bytes, fp8_param_gather.py); after the first step
    their parameters' full tensor is not gathered again.
    """

    def __init__(self, chunk_units, prefetch, targets=None):
        self.prefetch = prefetch
        self._targets = targets or {}
        self.order = [b for chunk in chunk_units for _, bs in chunk for b in bs]
        self._units = [[tuple(bs) for _, bs in chunk] for chunk in chunk_units]
        self._seen = {id(b): set() for b in self.order}
        self._bucket_of = {id(p): b for b in self.order for p in b.params}
        # which unit to prefetch after each: the next layer in forward; in backward the root is
        # first (from the chunk's output), then the layers from the last
        self._next = {+1: {}, -1: {}}
        for us in self._units:
            for a, b in zip(us, us[1:]):
                self._next[+1][id(a)] = b
            for a, b in zip([us[0]] + us[:0:-1], us[:0:-1]):
                self._next[-1][id(a)] = b
        self.initial = True  # the full tensors hold the initial values until the first step
        for chunk, us in zip(chunk_units, self._units):
            for (module, _), unit in zip(chunk, us):
                module.register_forward_pre_hook(self._pre_forward(unit))
                module.register_forward_hook(self._post_forward(unit))

    def _pre_forward(self, unit):
        def hook(module, args):
            self.gather(unit)
            self._prefetch(unit, +1)
        return hook

    def _post_forward(self, unit):
        def hook(module, args, out):
            if torch.is_grad_enabled():
                for t in _tensors(out):
                    if t.requires_grad:
                        t.register_hook(self._pre_backward(unit))
            for b in unit:
                self.release(b)
        return hook

    def _pre_backward(self, unit):
        def hook(grad):
            self.gather(unit)
            self._prefetch(unit, -1)
        return hook

    def _prefetch(self, unit, direction):
        nxt = self._next[direction].get(id(unit))
        if self.prefetch and nxt is not None:
            for b in nxt:
                self.start_gather(b)

    def _target(self, bucket):
        """(the full tensor gathered, this rank's persistent shard of it)."""
        return self._targets.get(id(bucket), (bucket.param, bucket.param_shard))

    def start_gather(self, bucket):
        full, shard = self._target(bucket)
        if self.initial or bucket.whole or bucket.param_handle is not None or is_allocated(full):
            return
        allocate(full)
        bucket.own(full).copy_(shard)
        bucket.param_handle = comm.all_gather_inplace_async(full, bucket.group, tag="dp-params")

    def gather(self, unit):
        """Make the unit's full parameter tensors hold the current values (blocking)."""
        for b in unit:
            self.start_gather(b)
        for b in unit:
            if b.param_handle is not None:
                b.param_handle.wait()
                b.param_handle = None

    def gather_params(self, params):
        """Make the full tensors of the buckets holding params current (blocking): a zero-bubble W
        runs autograd nodes again that may read them (a LayerNorm's backward reads its weight)."""
        self.gather(tuple({id(b): b for b in (self._bucket_of.get(id(p)) for p in params) if b is not None}.values()))

    def release(self, bucket):
        if self.initial or bucket.whole:
            return
        if bucket.param_handle is not None:
            bucket.param_handle.wait()
            bucket.param_handle = None
        release(self._target(bucket)[0])
        self._seen[id(bucket)].clear()

    def grad_ready(self, param):
        """Called once per parameter per backward: the bucket is released once all its
        parameters have their gradient (nothing left in this backward reads them)."""
        bucket = self._bucket_of[id(param)]
        seen = self._seen[id(bucket)]
        seen.add(id(param))
        if len(seen) == len(bucket.params):
            self.release(bucket)

    def reshard(self):
        """After the optimizer step (and before the first): the full tensors are stale (the
        first time: they hold the initial or loaded values, which become the shards); release them."""
        for b in self.order:
            if b.param_handle is not None:
                b.param_handle.wait()
                b.param_handle = None
            if self.initial and is_allocated(b.param) and not b.whole:
                b.param_shard.copy_(b.own(b.param))
                if id(b) in self._targets:  # from now on the other full tensor is gathered instead
                    release(b.param)
        self.initial = False
        for b in self.order:
            self.release(b)

    def working_set_bytes(self):
        """working_set() of these buckets in bytes (a unit's buckets may hold parameters of different dtypes)."""
        sizes = [[sum((b.end - b.start) * self._target(b)[0].element_size() for b in unit if not b.whole)
                  for unit in us] for us in self._units]
        return working_set(sizes, self.prefetch)

    def wait_all(self):
        for b in self.order:
            if b.param_handle is not None:
                b.param_handle.wait()
                b.param_handle = None
