"""The rank grid: one object holding every process group, built once.

Rank order (fixed): tensor-parallel ranks are adjacent, then data-parallel, then
pipeline-parallel ("tp-dp-pp", fastest first):

    global_rank = tp_rank + TP * (dp_rank + DP * pp_rank)

so a TP group is a run of TP consecutive ranks and stays inside a node whenever TP
divides the GPUs per node. Example, 8 ranks with TP=2, PP=2 (so DP=2):

    TP groups  [0,1] [2,3] [4,5] [6,7]
    DP groups  [0,2] [1,3] [4,6] [5,7]
    PP groups  [0,4] [1,5] [2,6] [3,7]
    MP groups  [0,1,4,5] [2,3,6,7]      (TP x PP: one model replica)

Expert parallelism (MoE) is carved out of the data-parallel ranks, as in Megatron-Core: EP
consecutive DP ranks form an expert-parallel group (they hold different experts), and the DP
ranks EP apart an expert-data-parallel group (replicas of the same experts), EP x EDP = DP.
With 8 ranks, TP=2, EP=2 (DP=4): EP groups [0,2] [4,6] [1,3] [5,7], EDP groups [0,4] [2,6] [1,5] [3,7].
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from .errors import ParallelConfigError


def validate_parallel_sizes(world_size: int, tensor_model_parallel_size: int,
                            pipeline_model_parallel_size: int,
                            virtual_pipeline_model_parallel_size: int | None = None) -> int:
    """Check the sizes before any group exists; returns the data-parallel size."""
    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    if tp < 1 or pp < 1:
        raise ParallelConfigError(
            f"--tensor-model-parallel-size ({tp}) and --pipeline-model-parallel-size ({pp}) "
            "must be at least 1")
    if world_size % (tp * pp) != 0:
        raise ParallelConfigError(
            f"world size {world_size} is not divisible by --tensor-model-parallel-size {tp} x "
            f"--pipeline-model-parallel-size {pp} = {tp * pp}; launch a multiple of {tp * pp} "
            "processes or change the parallel sizes")
    vpp = virtual_pipeline_model_parallel_size
    if vpp is not None and vpp > 1 and pp < 2:
        raise ParallelConfigError(
            "--num-virtual-stages-per-pipeline-rank (virtual pipeline stages) needs "
            "--pipeline-model-parallel-size of at least 2")
    return world_size // (tp * pp)


@dataclasses.dataclass
class ProcessGroups:
    """Every group this rank belongs to, with its position in the grid.

    tp: tensor-parallel group; dp: data-parallel group; pp: pipeline group;
    mp: model-parallel group (TP x PP, one model replica); embd: first and last
    pipeline stage of this (tp, dp) position, for tied embedding gradients.
    """
    tp: dist.ProcessGroup
    dp: dist.ProcessGroup
    pp: dist.ProcessGroup
    mp: dist.ProcessGroup
    embd: dist.ProcessGroup
    tp_size: int
    dp_size: int
    pp_size: int
    tp_rank: int
    dp_rank: int
    pp_rank: int
    rank: int
    world_size: int
    pp_ranks: list[int]
    vpp_size: int | None = None
    # MoE: expert-parallel group (None when EP = 1) and expert-data-parallel group (groups.dp when EP = 1)
    ep: dist.ProcessGroup | None = None
    edp: dist.ProcessGroup | None = None
    ep_size: int = 1
    ep_rank: int = 0
    edp_size: int = 1
    edp_rank: int = 0

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def describe(self) -> str:
        return (f"world {self.world_size} = TP {self.tp_size} x DP {self.dp_size} x PP {self.pp_size}"
                + (f" (virtual stages {self.vpp_size})" if self.vpp_size else "")
                + "; rank order tp-dp-pp (TP ranks adjacent)")


_GROUPS: ProcessGroups | None = None


def grid_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int) -> int:
    """Global rank of a grid position (see the module docstring)."""
    return tp_rank + tp * (dp_rank + dp * pp_rank)


def initialize_model_parallel(tensor_model_parallel_size: int = 1,
                              pipeline_model_parallel_size: int = 1,
                              virtual_pipeline_model_parallel_size: int | None = None,
                              expert_model_parallel_size: int = 1) -> ProcessGroups:
    """Build all groups over the default (world) group; every rank must call this.

    Needs torch.distributed initialised. Raises ParallelConfigError, before creating
    any group, when the sizes do not fit the world size.
    """
    global _GROUPS
    world, rank = dist.get_world_size(), dist.get_rank()
    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    dp = validate_parallel_sizes(world, tp, pp, virtual_pipeline_model_parallel_size)
    tp_rank, rest = rank % tp, rank // tp
    dp_rank, pp_rank = rest % dp, rest // dp

    def build(rank_lists):
        # new_group is collective over the world: every rank creates every group in
        # the same order and keeps the one that contains it.
        mine = None
        for ranks in rank_lists:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine = group
        return mine

    tp_lists = [[grid_rank(t, d, p, tp, dp) for t in range(tp)] for p in range(pp) for d in range(dp)]
    dp_lists = [[grid_rank(t, d, p, tp, dp) for d in range(dp)] for p in range(pp) for t in range(tp)]
    pp_lists = [[grid_rank(t, d, p, tp, dp) for p in range(pp)] for d in range(dp) for t in range(tp)]
    mp_lists = [[grid_rank(t, d, p, tp, dp) for p in range(pp) for t in range(tp)] for d in range(dp)]
    embd_lists = [sorted({r[0], r[-1]}) for r in pp_lists]

    groups = ProcessGroups(
        tp=build(tp_lists), dp=build(dp_lists), pp=build(pp_lists), mp=build(mp_lists),
        embd=build(embd_lists), tp_size=tp, dp_size=dp, pp_size=pp,
        tp_rank=tp_rank, dp_rank=dp_rank, pp_rank=pp_rank, rank=rank, world_size=world,
        pp_ranks=[grid_rank(tp_rank, dp_rank, p, tp, dp) for p in range(pp)],
        vpp_size=virtual_pipeline_model_parallel_size)
    _add_expert_groups(groups, expert_model_parallel_size, build)
    _GROUPS = groups
    return groups


def validate_expert_parallel_size(dp: int, ep: int) -> None:
    """ParallelConfigError unless EP divides the data-parallel size (expert groups are carved out of it)."""
    if ep < 1 or dp % ep:
        raise ParallelConfigError(
            f"--expert-model-parallel-size ({ep}) must divide the data-parallel size ({dp}): expert-parallel "
            "groups are carved out of the data-parallel ranks; change it or launch more processes")


def _add_expert_groups(g: ProcessGroups, ep: int, build) -> None:
    """Fill g.ep / g.edp (see the module docstring). Collective over the world."""
    tp, dp, pp = g.tp_size, g.dp_size, g.pp_size
    validate_expert_parallel_size(dp, ep)
    g.ep_size, g.ep_rank, g.edp_size, g.edp_rank = ep, g.dp_rank % ep, dp // ep, g.dp_rank // ep
    if ep == 1:
        g.edp = g.dp
        return
    ep_lists, edp_lists = expert_rank_lists(tp, dp, pp, ep)
    g.ep, g.edp = build(ep_lists), build(edp_lists)


def expert_rank_lists(tp: int, dp: int, pp: int, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    """(expert-parallel groups, expert-data-parallel groups) as lists of global ranks: per (tp, pp)
    position, EP consecutive DP ranks hold different experts; DP ranks EP apart hold the same ones."""
    cells = [(t, p) for p in range(pp) for t in range(tp)]
    return ([[grid_rank(t, d, p, tp, dp) for d in range(b, b + ep)] for t, p in cells for b in range(0, dp, ep)],
            [[grid_rank(t, d, p, tp, dp) for d in range(j, dp, ep)] for t, p in cells for j in range(ep)])


def get_process_groups() -> ProcessGroups:
    """The groups built by initialize_model_parallel (raises if it has not run)."""
    if _GROUPS is None:
        raise RuntimeError("initialize_model_parallel() has not been called")
    return _GROUPS


def destroy_model_parallel() -> None:
    """Forget the groups (the default group stays; destroy it with dist.destroy_process_group)."""
    global _GROUPS
    _GROUPS = None


def default_backend() -> str:
    """nccl when CUDA is usable, else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"
