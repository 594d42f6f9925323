"""Contiguous gradient (and, for the distributed optimizer, parameter) buffers, in buckets.

Parameters are laid out in reverse registration order, which is roughly the order in
which backward produces their gradients, so buckets fill one after another and each
can be reduced as soon as it is complete. With the distributed optimizer every bucket
is padded to a multiple of the DP size: DP rank r owns the r-th equal slice of each
bucket (its shard), which is where reduce-scatter leaves the summed gradients and from
where all-gather spreads the updated parameters.
"""
from dataclasses import dataclass

import torch

from .. import comm


@dataclass
class BucketLayout:
    start: int          # buffer offset of the first element
    end: int            # one past the last element, padding included
    params: list[int]   # indices (into the layout's parameter order) of its parameters


def bucket_layout(numels, bucket_size, dp_size, pad_for_shards):
    """Offsets of each parameter and the buckets, from parameter sizes in layout order.

    A bucket closes once it holds at least bucket_size elements. Pure function, shared
    with the memory estimator (buffers.buffer_layout) so its predictions are exact.
    Returns (offsets, buckets, total elements).
    """
    offsets, buckets = [], []
    start = pos = 0
    members = []
    for i, n in enumerate(numels):
        offsets.append(pos)
        pos += n
        members.append(i)
        if pos - start >= bucket_size or i == len(numels) - 1:
            if pad_for_shards:
                pos = -(-pos // dp_size) * dp_size if pos > start else pos
            buckets.append(BucketLayout(start, pos, members))
            start, members = pos, []
    return offsets, buckets, pos


class Bucket:
    """One bucket: views of the buffers and the state of its in-flight collectives."""

    def __init__(self, layout, params, grad_data, param_data, dp_group):
        self.params = params
        self.grad = grad_data[layout.start:layout.end]
        self.param = param_data[layout.start:layout.end] if param_data is not None else None
        self.param_shard = None  # the parameters are whole here (sharded_buffer.ShardedBucket may shard them)
        self.start, self.end = layout.start, layout.end
        self.group = dp_group
        self.grad_handle = self.param_handle = None
        self.pending = set()

    def shard(self):
        """[lo, hi) buffer offsets of this DP rank's slice."""
        k = (self.end - self.start) // comm.world(self.group)
        lo = self.start + comm.rank(self.group) * k
        return lo, lo + k


class ParamAndGradBuffer:
    """Buffers for parameters of one dtype: grad_data (grad_dtype) always, param_data
    (the parameters' own storage) with the distributed optimizer.

    Each parameter's main grad (main_grad(param)) is a view of grad_data; with param_data its `.data`
    becomes a view of param_data too, so all-gathering a bucket updates the model.
    """

    def __init__(self, params, grad_dtype, dp_group, offsets, layouts, distributed_optimizer):
        self.params = params  # in layout order (buffers.buffer_layout)
        total = layouts[-1].end if layouts else 0
        device = self.params[0].device
        self.grad_data = torch.zeros(total, dtype=grad_dtype, device=device)
        self.param_data = None
        if distributed_optimizer:
            self.param_data = torch.zeros(total, dtype=self.params[0].dtype, device=device)
        self.offsets = dict(zip(map(id, self.params), offsets))
        self.main_grads = {}
        for p, off in zip(self.params, offsets):
            n = p.numel()
            self.main_grads[id(p)] = self.grad_data[off:off + n].view_as(p)
            if self.param_data is not None:
                self.param_data[off:off + n].copy_(p.data.view(-1))
                p.data = self.param_data[off:off + n].view_as(p)
        self.buckets = [Bucket(lay, [self.params[i] for i in lay.params], self.grad_data,
                               self.param_data, dp_group) for lay in layouts]

    def offset(self, param):
        return self.offsets[id(param)]

    def main_grad(self, param):
        return self.main_grads[id(param)]

    def numel(self):
        return self.grad_data.numel()

    def zero_grad(self):
        self.grad_data.zero_()

    def param_view(self, param, lo, hi):
        """1-D view of param's flat [lo, hi) (the parameter's own storage)."""
        return param.detach().view(-1)[lo:hi]

    def grad_view(self, param, lo, hi):
        """1-D view of param's flat [lo, hi) in the gradient buffer."""
        return self.main_grads[id(param)].view(-1)[lo:hi]
