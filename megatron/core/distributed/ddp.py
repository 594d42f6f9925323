"""Data-parallel gradient reduction over contiguous, bucketed buffers.

Attaches to a model (the model is still called directly): gradients are accumulated
into `param.main_grad` (a view of the bucket buffer) by a hook after each backward, and
`.grad` is freed. Each parameter is expected to get one gradient per microbatch; once
all parameters of a bucket have their last one, the bucket is complete. With
overlap_grad_reduce its reduction starts right then, asynchronously, while backward
goes on through earlier layers; otherwise every bucket is reduced in finish_grad_sync().
Reduction is a sum over the DP group (the loss is already normalised by the global
batch's tokens): all-reduce, or reduce-scatter to each rank's shard with the
distributed optimizer, which then all-gathers the updated parameters per bucket.
"""
import torch

from .. import comm
from ..tensor_parallel.param_meta import is_expert_parallel
from .param_and_grad_buffer import ParamAndGradBuffer

DEFAULT_BUCKET_SIZE = 40_000_000


class DistributedDataParallel:
    """Gradient buffers and DP reductions for `module`'s parameters over `dp_group`.

    bucket_size: elements per bucket (default max(40M, 1M x DP), as Megatron-LM).
    grad_reduce_in_bf16: keep and reduce the gradients of bf16 parameters in bf16.
    expert_dp_group: with MoE expert parallelism, the expert-data-parallel group: the parameters of
    experts (param_meta.is_expert_parallel) get buffers of their own, reduced (sharded) over it.
    """

    def __init__(self, module, dp_group, bucket_size=None, overlap_grad_reduce=False,
                 use_distributed_optimizer=False, overlap_param_gather=False, grad_reduce_in_bf16=False,
                 expert_dp_group=None):
        self.module, self.dp_group = module, dp_group
        self.overlap_grad_reduce = overlap_grad_reduce
        self.use_distributed_optimizer = use_distributed_optimizer
        self.overlap_param_gather = overlap_param_gather and use_distributed_optimizer
        dp = comm.world(dp_group)
        bucket_size = bucket_size or max(DEFAULT_BUCKET_SIZE, 1_000_000 * dp)
        by_dtype = {}
        for p in module.parameters():
            if p.requires_grad:
                # MoE experts' parameters get buffers of their own, reduced over the expert-DP group
                key = (p.dtype, True) if expert_dp_group is not None and is_expert_parallel(p) else p.dtype
                by_dtype.setdefault(key, []).append(p)
        self.buffers = []
        for key, params in by_dtype.items():
            dtype, group = (key[0], expert_dp_group) if isinstance(key, tuple) else (key, dp_group)
            grad_dtype = torch.bfloat16 if (grad_reduce_in_bf16 and dtype == torch.bfloat16) else torch.float32
            self.buffers.append(ParamAndGradBuffer(params, grad_dtype, group, bucket_size,
                                                   use_distributed_optimizer))
        self.buckets = [b for buf in self.buffers for b in buf.buckets]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._counts = {}
        self.num_microbatches = 1
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad)
        if self.overlap_param_gather:
            for m in module.modules():
                if any(True for _ in m.parameters(recurse=False)):
                    m.register_forward_pre_hook(self._wait_params)

    # ---- gradients
    def start_step(self, num_microbatches):
        """Zero the buffers before the first microbatch of an iteration."""
        self.finish_param_sync()
        self.num_microbatches = num_microbatches
        for buf in self.buffers:
            buf.grad_data.zero_()
        self._counts = {}
        for b in self.buckets:
            b.pending = {id(p) for p in b.params}
            b.grad_handle = None

    def _on_grad(self, param):
        param.main_grad.add_(param.grad)
        param.grad = None
        key = id(param)
        self._counts[key] = self._counts.get(key, 0) + 1
        if self.overlap_grad_reduce and self._counts[key] == self.num_microbatches:
            bucket = self._bucket_of[key]
            bucket.pending.discard(key)
            if not bucket.pending:
                self._start_grad_sync(bucket)

    def _start_grad_sync(self, bucket):
        if self.use_distributed_optimizer:
            bucket.grad_handle = comm.reduce_scatter_inplace_async(bucket.grad, bucket.group, tag="dp-grads")
        else:
            bucket.grad_handle = comm.all_reduce_async(bucket.grad, bucket.group, tag="dp-grads")
        bucket.pending = None  # started

    def finish_grad_sync(self):
        """Start the buckets not yet started, then wait for all: grads are summed over DP."""
        for b in self.buckets:
            if b.pending is not None:
                self._start_grad_sync(b)
        for b in self.buckets:
            if b.grad_handle is not None:
                b.grad_handle.wait()
                b.grad_handle = None

    # ---- parameters (distributed optimizer)
    def start_param_sync(self):
        """All-gather every bucket's updated shards; waits unless overlap_param_gather."""
        # the first layers' parameters sit in the last bucket: gather those first
        for b in reversed(self.buckets):
            b.param_handle = comm.all_gather_inplace_async(b.param, b.group, tag="dp-params")
        if not self.overlap_param_gather:
            self.finish_param_sync()

    def finish_param_sync(self):
        for b in self.buckets:
            if b.param_handle is not None:
                b.param_handle.wait()
                b.param_handle = None

    def _wait_params(self, module, args):
        for p in module.parameters(recurse=False):
            b = self._bucket_of.get(id(p))
            if b is not None and b.param_handle is not None:
                b.param_handle.wait()
                b.param_handle = None

    def memory_bytes(self):
        """(parameter bytes, gradient bytes) held in buffers / by the module on this rank."""
        grads = sum(buf.grad_data.numel() * buf.grad_data.element_size() for buf in self.buffers)
        if self.use_distributed_optimizer:
            params = sum(buf.param_data.numel() * buf.param_data.element_size() for buf in self.buffers)
        else:
            params = sum(p.numel() * p.element_size() for p in self.module.parameters())
        return params, grads
