"""Data-parallel sharding strategies (Megatron-Core's names) and what each one shards.

    no_shard            every DP rank holds parameters, gradients and optimizer state whole
    optim               ZeRO-1: optimizer state (fp32 main values, Adam moments) sharded
    optim_grads         ZeRO-2: + the reduced gradients sharded
    optim_grads_params  ZeRO-3: + the parameters sharded (gathered per unit for forward and backward)
"""
SHARDING_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")


def resolve_strategy(strategy, use_distributed_optimizer: bool) -> str:
    """The strategy given, or from --use-distributed-optimizer (Megatron-LM's alias for optim) when unset."""
    if strategy is None:
        return "optim" if use_distributed_optimizer else "no_shard"
    return strategy


def shards_optimizer(strategy: str) -> bool:
    return strategy != "no_shard"


def shards_grads(strategy: str) -> bool:
    return strategy in ("optim_grads", "optim_grads_params")


def shards_params(strategy: str) -> bool:
    return strategy == "optim_grads_params"


HELD = {
    "no_shard": "parameters, gradients and optimizer state whole on every DP rank",
    "optim": "parameters and gradients whole, optimizer state sharded",
    "optim_grads": "parameters whole, reduced gradients and optimizer state sharded (full-size gradient "
                   "buckets only from their first gradient to their reduce-scatter)",
    "optim_grads_params": "parameters, reduced gradients and optimizer state sharded (full parameters only "
                          "for a unit's forward and backward, full gradient buckets only until reduced)",
}
