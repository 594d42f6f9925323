"""--fp8-param-gather (Megatron-LM's flag): the FP8 linears' weights cross the data-parallel group as FP8
bytes, one per element (a bf16 gather moves two, an fp32 one four), and their GEMMs read the gathered copy.

The weights sit in buffers of their own (buffers.buffer_groups), so each of their buckets is gathered in one
dtype. After each optimizer step, and before the first forward, every rank casts its shard of each such
bucket (Fp8Bucket.cast): per weight, the amax of its elements in the shard, MAX over the bucket's group (the
ranks holding the other shards) and over the weight scaler's groups (the TP ranks holding the weight's
other pieces: the scaler's own rule, fp8/scalers.py) is the amax of the weight that the linear casts; the
scale is the recipe's for it (delayed scaling: its history's, the amax joining the step's); the shard is cast
with it. The cast is elementwise, so the gathered bytes are exactly those the linear's own cast of the whole
weight gives: the flag changes no value, only what is gathered and held.

ZeRO-1/2 gather each bucket's bytes after the cast into a full copy kept across the step: n bytes beside the
bucket's n high-precision elements, which outside this rank's shard are then not gathered (stale: only the
FP8 copy is read; checkpoints take the optimizer's main values). ZeRO-3 keeps the cast shard (n/d bytes)
and gathers it per unit where it gathers parameters (zero3.py); the high-precision full tensor of such a
bucket is released at the first step and not gathered again.
"""
import torch

from .. import comm
from ..fp8.formats import amax, quantize
from .sharded_buffer import release


class WeightCopy:
    """One weight's FP8 values (`data`, its shape, a view of its bucket's gathered bytes that no write through
    the bucket marks as modified for autograd) and the scale they were cast with (`scale`, 0-d fp32)."""

    __slots__ = ("data", "scale")

    def __init__(self, data, scale):
        self.data, self.scale = data, scale


class Fp8Bucket:
    """The FP8 bytes of one bucket of FP8 weights. entries: (param, buffer offset, recipe) of the bucket's
    parameters; sharded: ZeRO-3 (the full bytes exist only while gathered, the shard persists)."""

    def __init__(self, bucket, entries, sharded):
        self.bucket, self.entries = bucket, entries
        device = bucket.params[0].device
        self.full = torch.zeros(bucket.end - bucket.start, dtype=torch.uint8, device=device)
        lo, hi = bucket.shard()
        gathered_per_unit = sharded and comm.world(bucket.group) > 1
        self.shard = torch.zeros(hi - lo, dtype=torch.uint8, device=device) if gathered_per_unit \
            else self.full[lo - bucket.start:hi - bucket.start]
        self.copies = []
        for p, off, recipe in entries:
            view = self.full[off - bucket.start:off - bucket.start + p.numel()].view(recipe.fwd).view(p.shape)
            # .data: its own version counter, so gathering into the bucket between a forward and its backward
            # (ZeRO-3) does not count as changing the copy the forward saved
            self.copies.append(WeightCopy(view.data, torch.ones((), dtype=torch.float32, device=device)))
        if gathered_per_unit:  # after the views exist (a view of a released storage cannot be made)
            release(self.full)
        # weights whose scalers reduce over the same groups reduce their amaxes together
        self._by_groups = {}
        for i, (_, _, recipe) in enumerate(entries):
            groups = tuple(g for g in recipe.weight_scaler().groups if g is not None)
            self._by_groups.setdefault(tuple(map(id, groups)), (groups, []))[1].append(i)

    def cast(self, own):
        """Cast this rank's shard `own` (the bucket's high-precision values in [lo, hi) of shard()) into the
        shard's bytes, each weight with the scale of the whole weight's amax; the copies' scales are set."""
        lo, hi = self.bucket.shard()
        spans, amaxes = [], []
        for p, off, _ in self.entries:
            a, b = max(off, lo) - lo, min(off + p.numel(), hi) - lo
            spans.append((a, b) if a < b else None)
            amaxes.append(amax(own[a:b]) if a < b else torch.zeros((), dtype=torch.float32, device=own.device))
        amaxes = torch.stack(amaxes)
        comm.all_reduce_max_(amaxes, self.bucket.group)
        for groups, index in self._by_groups.values():
            if groups:
                part = amaxes[index]
                for g in groups:
                    comm.all_reduce_max_(part, g)
                amaxes[index] = part
        for (_, _, recipe), copy, span, a in zip(self.entries, self.copies, spans, amaxes):
            copy.scale.copy_(recipe.weight_scaler().scale_of_amax(a))
            if span is not None:
                self.shard[span[0]:span[1]].copy_(quantize(own[span[0]:span[1]], copy.scale, recipe.fwd)
                                                  .view(torch.uint8))

    def use(self):
        """From now on the recipes read these copies (recipes.PerTensorRecipe.use_weight_copy)."""
        for (_, _, recipe), copy in zip(self.entries, self.copies):
            recipe.use_weight_copy(copy)


def own_values(bucket):
    """The bucket's high-precision values in this rank's shard: ZeRO-3's persistent shard, else the slice of
    the bucket's whole parameters (where the optimizer wrote this rank's update)."""
    if bucket.param_shard is not None:
        return bucket.param_shard
    lo, hi = bucket.shard()
    return bucket.param[lo - bucket.start:hi - bucket.start]
