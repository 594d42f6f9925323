"""DistributedDataParallelConfig: how DDP holds and reduces gradients, as one value (Megatron-Core's name).

The data-parallel sharding strategy (strategy.py) is the one fact the distributed optimizer, the
sharded buffers, the optimizer's class, the planner, the estimator and the checkpoint metadata read:
each asks this config what is sharded, none rebuilds the strategy from a flag.
"""
import dataclasses

from .strategy import SHARDING_STRATEGIES, shards_grads, shards_optimizer, shards_params

DEFAULT_BUCKET_SIZE = 40_000_000


@dataclasses.dataclass(frozen=True)
class DistributedDataParallelConfig:
    """data_parallel_sharding_strategy: no_shard, optim (ZeRO-1), optim_grads (ZeRO-2) or
    optim_grads_params (ZeRO-3); bucket_size: elements per bucket (None: bucket_elements' default);
    overlap_grad_reduce / overlap_param_gather: reduce each bucket as it completes / gather the updated
    parameters during the next forward (with a sharded optimizer only); grad_reduce_in_bf16: keep and
    reduce the gradients of bf16 parameters in bf16; fp8_param_gather: the FP8 linears' weights in buffers of
    their own, gathered as FP8 bytes (fp8_param_gather.py; with a sharded optimizer only)."""
    data_parallel_sharding_strategy: str = "no_shard"
    bucket_size: int | None = None
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    grad_reduce_in_bf16: bool = False
    fp8_param_gather: bool = False

    def __post_init__(self):
        if self.data_parallel_sharding_strategy not in SHARDING_STRATEGIES:
            raise ValueError(f"data_parallel_sharding_strategy {self.data_parallel_sharding_strategy!r}: "
                             f"one of {', '.join(SHARDING_STRATEGIES)}")

    @property
    def shards_optimizer(self) -> bool:
        """The optimizer state is sharded over DP (any strategy but no_shard): the distributed optimizer."""
        return shards_optimizer(self.data_parallel_sharding_strategy)

    @property
    def shards_grads(self) -> bool:
        return shards_grads(self.data_parallel_sharding_strategy)

    @property
    def shards_params(self) -> bool:
        return shards_params(self.data_parallel_sharding_strategy)

    def bucket_elements(self, dp: int) -> int:
        """Elements per bucket over `dp` ranks: bucket_size, or max(40M, 1M x DP) as Megatron-LM."""
        return self.bucket_size or max(DEFAULT_BUCKET_SIZE, 1_000_000 * dp)
