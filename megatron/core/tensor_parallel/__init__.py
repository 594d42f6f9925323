"""Tensor parallelism: autograd collectives, parallel layers, vocab-parallel loss, RNG tracker, recompute."""
from .cross_entropy import vocab_parallel_cross_entropy
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .mappings import (
                       copy_to_tensor_model_parallel_region,
                       gather_from_sequence_parallel_region,
                       gather_from_tensor_model_parallel_region,
                       reduce_from_tensor_model_parallel_region,
                       reduce_scatter_to_sequence_parallel_region,
                       scatter_to_sequence_parallel_region,
                       scatter_to_tensor_model_parallel_region,
)
from .random import checkpoint, get_rng_tracker, model_parallel_seed
