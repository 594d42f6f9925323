"""The distributed optimizer (--use-distributed-optimizer; ZeRO stage 1).

Each DP rank keeps fp32 main values and Adam state for its 1/DP shard of every DDP
bucket only (param_and_grad_buffer pads buckets to a multiple of DP). DDP reduce-scatters
the gradients to those shards; each rank updates its shard; the buckets are then
all-gathered over DP so every rank holds the whole updated model (overlapped with the next
forward under --overlap-param-gather). The grad norm sums every shard, so it adds DP to
the model-parallel group.
"""
from .megatron_optimizer import MegatronOptimizer


class DistributedOptimizer(MegatronOptimizer):
    """MegatronOptimizer on this DP rank's shard of each bucket. Talks to groups.mp and groups.dp."""

    distributed_optimizer = True

    def _ranges(self):
        """(param, lo, hi): the part of each parameter inside this rank's shard of its bucket."""
        out = []
        for buf in self.ddp.buffers:
            for bucket in buf.buckets:
                shard_lo, shard_hi = bucket.shard()
                for p in bucket.params:
                    off = buf.offset(p)
                    lo, hi = max(off, shard_lo), min(off + p.numel(), shard_hi)
                    if lo < hi:
                        out.append((p, lo - off, hi - off))
        return out

    def _norm_groups(self):
        return [self.groups.mp, self.groups.dp_cp]  # shards are over DDP's group, DP x CP

    def _after_update(self):
        self.ddp.start_param_sync()
