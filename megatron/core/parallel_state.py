"""Megatron-Core's entry point to the rank grid, kept for its name: the grid itself is
parallel_layout.ParallelLayout (sizes, positions, rank lists, built once from the config) and the groups
of one rank are process_groups.ProcessGroups, built from it and passed down. There is no global here:
code that needs a group gets it from the ProcessGroups it was given.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .errors import ParallelConfigError as ParallelConfigError  # re-exported: callers catch it from here
from .parallel_layout import ParallelLayout
from .process_groups import ProcessGroups as ProcessGroups


def initialize_model_parallel(tensor_model_parallel_size: int = 1,
                              pipeline_model_parallel_size: int = 1,
                              virtual_pipeline_model_parallel_size: int | None = None,
                              context_parallel_size: int = 1,
                              expert_model_parallel_size: int = 1,
                              expert_tensor_parallel_size: int | None = None,
                              pipeline_grad_group: bool = False) -> ProcessGroups:
    """ParallelLayout(world, sizes...).build_groups() over the default (world) group; every rank must
    call it. pipeline_grad_group: ZB-V's V and its second pipeline group (schedule "zb_v"). Raises
    ParallelConfigError, before creating any group, when the sizes do not fit the world size."""
    layout = ParallelLayout(dist.get_world_size(), tensor_model_parallel_size, context_parallel_size,
                            pipeline_model_parallel_size, virtual_pipeline_model_parallel_size,
                            expert_model_parallel_size, expert_tensor_parallel_size,
                            "zb_v" if pipeline_grad_group else None)
    return layout.build_groups()


def default_backend() -> str:
    """nccl when CUDA is usable, else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"
