"""Gradient reduction across data-parallel (and TP, for sequence-parallel weights) ranks."""
from .ddp import DistributedDataParallel
from .ddp_config import DistributedDataParallelConfig
from .finalize import finalize_model_grads
