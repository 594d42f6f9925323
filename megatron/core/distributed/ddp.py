"""Data-parallel gradient reduction over contiguous, bucketed buffers.

Attaches to a model (the model is still called directly): gradients are accumulated
into the parameter's main grad (main_grad(param), a view of the bucket buffer) by a hook after
each backward, and `.grad` is freed; with gradient_accumulation_fusion the linear layers add their
weight gradients there themselves (tensor_parallel/wgrad_fusion.py: DDP is each parameter's
ParamMeta.grad_sink, grad_target() and grad_added() its side of that contract). Each parameter is
expected to get one gradient per microbatch; once all parameters of a bucket have their last one, the
bucket is complete. With
overlap_grad_reduce its reduction starts right then, asynchronously, while backward
goes on through earlier layers; otherwise every bucket is reduced in finish_grad_sync().
Reduction is a sum over the DP group (the loss is already normalised by the global
batch's tokens): all-reduce, or reduce-scatter to each rank's shard with the
distributed optimizer, which then all-gathers the updated parameters per bucket.

The data-parallel sharding strategy (DistributedDataParallelConfig, strategy.py) optim_grads and
optim_grads_params keep only the reduced gradient shard (and, for the latter, the parameter shard)
across the step: sharded_buffer.py says what is held when, zero3.py how parameters are gathered per unit.
With fp8_param_gather the FP8 linears' weights are gathered as FP8 bytes (fp8_param_gather.py).
"""
import torch

from .. import comm
from ..fp8.weights import fp8_weight_pairs
from ..tensor_parallel.param_meta import param_meta, set_grad_sink
from . import zero3
from .buffers import buffer_groups, buffer_layout
from .ddp_config import DistributedDataParallelConfig
from .fp8_param_gather import Fp8Bucket, own_values
from .param_and_grad_buffer import ParamAndGradBuffer
from .sharded_buffer import ShardedBuffer
from .strategy import HELD


class DistributedDataParallel:
    """Gradient buffers and DP reductions for `module`'s parameters over groups.dp_cp, as `config`
    (DistributedDataParallelConfig) says: bucket size, overlap, the sharding strategy (any but no_shard
    implies the distributed optimizer). With MoE experts of their own expert-DP group
    (groups.layout.expert_dp_apart) the experts' parameters get buffers of their own, reduced over
    groups.edp and, with any strategy but no_shard, sharded over it as the dense ones over DP x CP
    (ZeRO-3: gathered over it). config.fp8_param_gather: the FP8 linears' weights (fp8/weights.py) in buffers
    of their own, whose buckets are cast to FP8 per shard after each step and gathered as bytes.

    gradient_accumulation_fusion: offer the buffers to the layers, which add their weight gradients
    straight into them (the model's --gradient-accumulation-fusion; wgrad_fusion.py); False: every
    gradient comes through .grad and the hook.
    """

    def __init__(self, module, groups, config=None, gradient_accumulation_fusion=False):
        config = config or DistributedDataParallelConfig()
        self.module, self.config, self.dp_group = module, config, groups.dp_cp
        self.overlap_grad_reduce = config.overlap_grad_reduce
        self.overlap_param_gather = config.overlap_param_gather and config.shards_optimizer
        recipes = {id(p): r for p, r in fp8_weight_pairs(module)} if config.fp8_param_gather else {}
        by_dtype = buffer_groups(module.parameters(), groups.layout.expert_dp_apart, recipes)
        self.buffers = []
        chunk_units = zero3.units(module) if self.config.shards_params else None
        fp8_buffers = []
        for (dtype, expert, fp8), params in by_dtype.items():
            group = groups.edp if expert else groups.dp_cp
            bucket_size = config.bucket_elements(comm.world(groups.dp_cp))
            grad_dtype = torch.bfloat16 if (config.grad_reduce_in_bf16 and dtype == torch.bfloat16) else torch.float32
            ordered, offsets, layouts, _ = buffer_layout(params, bucket_size, comm.world(group), config, chunk_units)
            if self.config.shards_grads:
                self.buffers.append(ShardedBuffer(ordered, grad_dtype, group, offsets, layouts, config.shards_params))
            else:
                self.buffers.append(ParamAndGradBuffer(ordered, grad_dtype, group, offsets, layouts,
                                                       config.shards_optimizer))
            if fp8:
                fp8_buffers.append(self.buffers[-1])
        self.buckets = [b for buf in self.buffers for b in buf.buckets]
        # {id(bucket): Fp8Bucket} of the FP8 weights' buckets; cast for the first time by the first step
        self._fp8 = {id(b): Fp8Bucket(b, [(p, buf.offset(p), recipes[id(p)]) for p in b.params], config.shards_params)
                     for buf in fp8_buffers for b in buf.buckets}
        self._fp8_cast = False
        self._buffer_of = {id(p): buf for buf in self.buffers for b in buf.buckets for p in b.params}
        # with a sharded optimizer a tied word table's gradient is summed over groups.embd before the DP
        # reduction (finalize_model_grads): the first and the last stage's DP shards of the table are other
        # slices of it (its buffer offsets differ), and ZB-V's two copies on rank 0 too; so its bucket is not
        # reduced early
        deferred = self.config.shards_optimizer
        self._deferred = {id(b) for b in self.buckets
                          if deferred and any(param_meta(p).tied_embedding for p in b.params)}
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.gatherer = None
        if self.config.shards_params:
            self.gatherer = zero3.ParamGatherer(
                [[(m, list({id(b): b for b in (self._bucket_of[id(p)] for p in ps)}.values())) for m, ps in chunk]
                 for chunk in chunk_units], config.overlap_param_gather,
                {key: (fb.full, fb.shard) for key, fb in self._fp8.items()})
        self._counts = {}
        self.num_microbatches = 1
        self.gradient_accumulation_fusion = gradient_accumulation_fusion
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad)
                set_grad_sink(p, self if gradient_accumulation_fusion else None)
        if self.overlap_param_gather and not self.config.shards_params:
            for m in module.modules():
                if any(True for _ in m.parameters(recurse=False)):
                    m.register_forward_pre_hook(self._wait_params)

    # ---- gradients
    def start_step(self, num_microbatches):
        """A new iteration: no gradient has arrived. The buffers are not zeroed: each parameter's first
        gradient of the step is written into its main grad (grad_is_first), later ones added, and
        finish_grad_sync zeroes the main grads no gradient reached (one pass fewer over the buffer)."""
        self.finish_param_sync()
        self.num_microbatches = num_microbatches
        self._counts = {}
        for b in self.buckets:
            b.pending = {id(p) for p in b.params}
            b.grad_handle = None

    def main_grad(self, param):
        """param's gradient in the buffer (its shape): summed over microbatches, then over DP by
        finish_grad_sync. With sharded gradients a view of storage that exists during backward only."""
        return self._buffer_of[id(param)].main_grad(param)

    def grad_target(self, param):
        """main_grad(param), ready to add this backward's gradient into (a released bucket of sharded
        gradients is allocated and zeroed first)."""
        if self.config.shards_grads:
            self._bucket_of[id(param)].ensure_grad()
        return self.main_grad(param)

    def grad_is_first(self, param):
        """Whether no gradient of param has arrived this step: its main grad holds stale values, to be
        overwritten, not added to."""
        return id(param) not in self._counts

    def _on_grad(self, param):
        if param.grad is None:  # no gradient reached .grad: nothing to add, nothing to count
            return
        target = self.grad_target(param)
        target.copy_(param.grad) if self.grad_is_first(param) else target.add_(param.grad)
        param.grad = None
        self.grad_added(param)

    def grad_added(self, param):
        """This backward's gradient of param is in its main grad: count it; a bucket whose parameters all
        have their last microbatch's starts its reduction (overlap_grad_reduce)."""
        key = id(param)
        self._counts[key] = self._counts.get(key, 0) + 1
        if self.overlap_grad_reduce and self._counts[key] == self.num_microbatches:
            bucket = self._bucket_of[key]
            bucket.pending.discard(key)
            if not bucket.pending and id(bucket) not in self._deferred:
                self._start_grad_sync(bucket)
        if self.gatherer is not None:
            self.gatherer.grad_ready(param)

    def _start_grad_sync(self, bucket):
        if self.config.shards_grads:
            for b in self.buckets:  # the earlier ones first: at most two full gradient buckets alive
                if b.grad_handle is not None:
                    b.finish_reduce()
            bucket.start_reduce("dp-grads")
        elif self.config.shards_optimizer:
            bucket.grad_handle = comm.reduce_scatter_inplace_async(bucket.grad, bucket.group, tag="dp-grads")
        else:
            bucket.grad_handle = comm.all_reduce_async(bucket.grad, bucket.group, tag="dp-grads")
        bucket.pending = None  # started

    def finish_grad_sync(self, before_reduce=None):
        """Start the buckets not yet started, then wait for all: grads are summed over DP.

        before_reduce: called once the full gradients are complete and before the buckets not
        yet started are reduced (with sharded gradients: sums that must precede the DP reduction)."""
        self.zero_unreached_grads()
        if before_reduce is not None:
            for b in self.buckets:
                if self.config.shards_grads and b.pending is not None:
                    b.ensure_grad()
            before_reduce()
        for b in self.buckets:
            if b.pending is not None:
                self._start_grad_sync(b)
        for b in self.buckets:
            if self.config.shards_grads:
                b.finish_reduce()
            elif b.grad_handle is not None:
                b.grad_handle.wait()
                b.grad_handle = None

    def zero_unreached_grads(self):
        """Zero the main grads no gradient reached this step (start_step leaves the buffers as they were;
        a released bucket of sharded gradients is allocated zeroed by its first gradient). Called before
        the main grads are read (finish_grad_sync; finalize_model_grads first where it sums before)."""
        if self.config.shards_grads:
            return
        for b in self.buckets:
            for p in b.params:
                if id(p) not in self._counts:
                    self.main_grad(p).zero_()
                    self._counts[id(p)] = 0  # zeroed: a later gradient adds, a second call leaves it

    def before_weight_grads(self, params):
        """Called by a zero-bubble W before it computes params' gradients (pipeline_parallel/
        backward_split.py): with sharded parameters, gathers them (released since the B, maybe)."""
        if self.gatherer is not None:
            self.gatherer.gather_params(params)

    # ---- parameters (distributed optimizer)
    def start_param_sync(self):
        """All-gather every bucket's updated shards; waits unless overlap_param_gather. ZeRO-3:
        release the stale full parameters instead (each unit is gathered before its next use)."""
        if self.gatherer is not None:
            self.gatherer.reshard()
            self.refresh_fp8_weights()
            return
        # the first layers' parameters sit in the last bucket: gather those first
        for b in reversed(self.buckets):
            if id(b) not in self._fp8:
                b.param_handle = comm.all_gather_inplace_async(b.param, b.group, tag="dp-params")
        self.refresh_fp8_weights()
        if not self.overlap_param_gather:
            self.finish_param_sync()

    def refresh_fp8_weights(self):
        """Cast every FP8 weight bucket's shard with the weights' current scales and (but ZeRO-3, which
        gathers per unit) start gathering its bytes: after each step, before the first (finish_param_sync),
        and after a step skipped for fp16 overflow (delayed scales still moved). Nothing without them."""
        for b in reversed(self.buckets):
            fb = self._fp8.get(id(b))
            if fb is None:
                continue
            fb.cast(own_values(b))
            if self.gatherer is None:
                b.param_handle = comm.all_gather_inplace_async(fb.full, b.group, tag="dp-params")
            if not self._fp8_cast:
                fb.use()
        self._fp8_cast = True

    def fp8_buckets(self):
        """The fp8_param_gather.Fp8Bucket of each bucket of FP8 weights (none without fp8_param_gather)."""
        return list(self._fp8.values())

    def finish_param_sync(self):
        if self.gatherer is not None:
            if self.gatherer.initial:
                self.gatherer.reshard()
            if not self._fp8_cast:
                self.refresh_fp8_weights()
            self.gatherer.wait_all()
            return
        if not self._fp8_cast:  # before the first step every rank holds the whole weights
            self.refresh_fp8_weights()
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
        """(parameter bytes, gradient bytes) held in buffers / by the module on this rank across
        the step (sharded_buffer.py: what the sharded strategies hold only for a while)."""
        if self.config.shards_grads:
            sizes = [buf.memory_bytes() for buf in self.buffers]
            return sum(s[0] for s in sizes) + self._fp8_bytes(), sum(s[1] for s in sizes)
        grads = sum(buf.grad_data.numel() * buf.grad_data.element_size() for buf in self.buffers)
        if self.config.shards_optimizer:
            params = sum(buf.param_data.numel() * buf.param_data.element_size() for buf in self.buffers)
        else:
            params = sum(p.numel() * p.element_size() for p in self.module.parameters())
        return params + self._fp8_bytes(), grads

    def _fp8_bytes(self):
        """Bytes of the FP8 weights' copies held across the step: ZeRO-3 the shards, else the full copies."""
        return sum((fb.shard if self.config.shards_params else fb.full).numel() for fb in self._fp8.values())

    # ---- where the optimizer finds its ranges
    def param_view(self, param, lo, hi):
        """1-D view of where param's flat [lo, hi) persists on this rank (the optimizer writes it)."""
        return self._buffer_of[id(param)].param_view(param, lo, hi)

    def grad_view(self, param, lo, hi):
        """1-D view of the DP-summed gradient of param's flat [lo, hi) after finish_grad_sync."""
        return self._buffer_of[id(param)].grad_view(param, lo, hi)

    def reduced_grads(self, param):
        """The tensors holding param's DP-summed gradient on this rank: main_grad, or with sharded
        gradients the part of it in this rank's shard (none when it lies outside)."""
        if not self.config.shards_grads:
            return [self.main_grad(param)]
        bucket = self._bucket_of[id(param)]
        lo, hi = bucket.shard()
        off = self._buffer_of[id(param)].offset(param)
        lo, hi = max(lo, off) - off, min(hi, off + param.numel()) - off
        return [self.grad_view(param, lo, hi)] if lo < hi else []

    def describe(self):
        """One start-up log line: the strategy, what it holds, ZeRO-3's gathered working set."""
        strategy = self.config.data_parallel_sharding_strategy
        line = f"> data-parallel sharding: {strategy}: {HELD[strategy]}"
        if self.gatherer is not None:
            line += f"; gathered parameters up to {self.gatherer.working_set_bytes():,} bytes per rank"
        return line
