"""The rank grid: one object holding every process group, built once.

Rank order (fixed, Megatron-Core's): tensor-parallel ranks are adjacent, then
context-parallel, then data-parallel, then pipeline-parallel ("tp-cp-dp-pp", fastest first):

    global_rank = tp_rank + TP * (cp_rank + CP * (dp_rank + DP * pp_rank))

so a TP group is a run of TP consecutive ranks and stays inside a node whenever TP
divides the GPUs per node. Example, 8 ranks with TP=2, PP=2 (so DP=2):

    TP groups  [0,1] [2,3] [4,5] [6,7]
    DP groups  [0,2] [1,3] [4,6] [5,7]
    PP groups  [0,4] [1,5] [2,6] [3,7]
    MP groups  [0,1,4,5] [2,3,6,7]      (TP x PP: one model replica)

With CP > 1 the CP ranks of a (tp, dp, pp) position hold the same parameters and different parts
of each sequence: gradients and loss sums are reduced over DP x CP (the dp_cp group). Example,
8 ranks with TP=2, CP=2, PP=2 (so DP=1): CP groups [0,2] [1,3] [4,6] [5,7].

Expert parallelism (MoE) is carved out of the data-parallel ranks, as in Megatron-Core: EP
consecutive DP x CP ranks (CP fastest, as in the dp_cp group) form an expert-parallel group (they
hold different experts), and the DP x CP ranks EP apart an expert-data-parallel group (replicas of
the same experts), EP x EDP = DP x CP.
With 8 ranks, TP=2, EP=2 (DP=4): EP groups [0,2] [4,6] [1,3] [5,7], EDP groups [0,4] [2,6] [1,5] [3,7].

MoE parallel folding (--expert-tensor-parallel-size ETP != TP, Megatron-Core's): within each
pipeline stage the TP x CP x DP ranks, indexed i = tp + TP * (cp + CP * dp), are re-split for the
experts as ETP (fastest) x EP x EDP: etp_rank = i % ETP, ep_rank = (i // ETP) % EP, edp_rank =
i // (ETP x EP), so EP may span TP ranks. At ETP = TP this is the grid above. With 4 ranks, TP=2,
DP=2, ETP=1, EP=4: one EP group [0,1,2,3], EDP groups [0] [1] [2] [3] (expert_grid_rank_lists).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from .errors import ParallelConfigError


def validate_parallel_sizes(world_size: int, tensor_model_parallel_size: int,
                            pipeline_model_parallel_size: int,
                            virtual_pipeline_model_parallel_size: int | None = None,
                            context_parallel_size: int = 1) -> int:
    """Check the sizes before any group exists; returns the data-parallel size."""
    tp, pp, cp = tensor_model_parallel_size, pipeline_model_parallel_size, context_parallel_size
    if tp < 1 or pp < 1:
        raise ParallelConfigError(
            f"--tensor-model-parallel-size ({tp}) and --pipeline-model-parallel-size ({pp}) "
            "must be at least 1")
    if cp < 1:
        raise ParallelConfigError(f"--context-parallel-size ({cp}) must be at least 1")
    if cp > 1 and world_size % (tp * cp * pp) != 0:
        raise ParallelConfigError(
            f"world size {world_size} is not divisible by --tensor-model-parallel-size {tp} x "
            f"--context-parallel-size {cp} x --pipeline-model-parallel-size {pp} = {tp * cp * pp}; launch a "
            f"multiple of {tp * cp * pp} processes or change the parallel sizes")
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
    return world_size // (tp * cp * pp)


@dataclasses.dataclass
class ProcessGroups:
    """Every group this rank belongs to, with its position in the grid.

    tp: tensor-parallel group; dp: data-parallel group; pp: pipeline group;
    mp: model-parallel group (TP x PP, one model replica); embd: first and last
    pipeline stage of this (tp, dp) position, for tied embedding gradients. pp_grad: the
    pipeline group again (same ranks), built only for ZB-V (add_pipeline_grad_group). cp: context-parallel
    group (the ranks splitting each sequence); dp_cp: DP x CP, over which gradients and loss sums
    are reduced (the dp group itself when CP is 1).
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
    cp: dist.ProcessGroup | None = None
    dp_cp: dist.ProcessGroup | None = None
    cp_size: int = 1
    cp_rank: int = 0
    # MoE: expert-parallel group (None when EP = 1) and expert-data-parallel group (groups.dp_cp when EP = 1)
    ep: dist.ProcessGroup | None = None
    edp: dist.ProcessGroup | None = None
    ep_size: int = 1
    ep_rank: int = 0
    edp_size: int = 1
    edp_rank: int = 0
    # ZB-V: a second pipeline group, same ranks as pp, carrying the gradients (backward direction)
    # so they never meet the activations in one ordered channel (add_pipeline_grad_group)
    pp_grad: dist.ProcessGroup | None = None
    # MoE parallel folding (expert TP != TP): the expert-TP group (groups.tp when not folded) and the TP x CP
    # ranks that share each sequence (each routes its own share of the tokens; None when not folded)
    etp: dist.ProcessGroup | None = None
    etp_size: int = 1
    etp_rank: int = 0
    expert_folded: bool = False
    tp_cp: dist.ProcessGroup | None = None

    def __post_init__(self):
        if self.dp_cp is None:  # without context parallelism gradients are reduced over DP alone
            self.dp_cp = self.dp
        if not self.expert_folded:  # the experts are split over TP like the dense layers
            self.etp, self.etp_size, self.etp_rank = self.tp, self.tp_size, self.tp_rank

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def describe(self) -> str:
        if self.expert_folded:  # the experts re-split TP x CP x DP (parallel folding)
            return self._describe_grid() + (f"; experts folded over expert-TP {self.etp_size} x EP {self.ep_size} x "
                                             f"expert-DP {self.edp_size}")
        if self.ep_size > 1:  # experts are split over DP x CP
            return self._describe_grid() + f"; experts over EP {self.ep_size} x expert-DP {self.edp_size}"
        return self._describe_grid()

    def _describe_grid(self) -> str:
        if self.cp_size > 1:
            return (f"world {self.world_size} = TP {self.tp_size} x CP {self.cp_size} x DP {self.dp_size} x PP "
                    f"{self.pp_size}" + (f" (virtual stages {self.vpp_size})" if self.vpp_size else "")
                    + "; rank order tp-cp-dp-pp (TP ranks adjacent)")
        return (f"world {self.world_size} = TP {self.tp_size} x DP {self.dp_size} x PP {self.pp_size}"
                + (f" (virtual stages {self.vpp_size})" if self.vpp_size else "")
                + "; rank order tp-dp-pp (TP ranks adjacent)")


_GROUPS: ProcessGroups | None = None


def grid_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int, cp_rank: int = 0, cp: int = 1) -> int:
    """Global rank of a grid position (see the module docstring)."""
    return tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))


def grid_rank_lists(tp: int, cp: int, dp: int, pp: int) -> dict[str, list[list[int]]]:
    """{group name: the global ranks of each group of that kind}, in the order they are built:
    tp, dp, pp, mp (TP x PP), embd (first and last stage), and with cp > 1 also cp and dp_cp."""
    def at(t, c, d, p):
        return grid_rank(t, d, p, tp, dp, c, cp)

    T, C, D, P = range(tp), range(cp), range(dp), range(pp)
    lists = {"tp": [[at(t, c, d, p) for t in T] for p in P for d in D for c in C],
             "dp": [[at(t, c, d, p) for d in D] for p in P for c in C for t in T],
             "pp": [[at(t, c, d, p) for p in P] for d in D for c in C for t in T],
             "mp": [[at(t, c, d, p) for p in P for t in T] for d in D for c in C]}
    lists["embd"] = [sorted({r[0], r[-1]}) for r in lists["pp"]]
    if cp > 1:
        lists["cp"] = [[at(t, c, d, p) for c in C] for p in P for d in D for t in T]
        lists["dp_cp"] = [[at(t, c, d, p) for d in D for c in C] for p in P for t in T]
    return lists


def initialize_model_parallel(tensor_model_parallel_size: int = 1,
                              pipeline_model_parallel_size: int = 1,
                              virtual_pipeline_model_parallel_size: int | None = None,
                              context_parallel_size: int = 1,
                              expert_model_parallel_size: int = 1,
                              expert_tensor_parallel_size: int | None = None,
                              pipeline_grad_group: bool = False) -> ProcessGroups:
    """Build all groups over the default (world) group; every rank must call this.
    pipeline_grad_group: also build groups.pp_grad (ZB-V; add_pipeline_grad_group).

    Needs torch.distributed initialised. Raises ParallelConfigError, before creating
    any group, when the sizes do not fit the world size.
    """
    global _GROUPS
    world, rank = dist.get_world_size(), dist.get_rank()
    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    cp = context_parallel_size
    dp = validate_parallel_sizes(world, tp, pp, virtual_pipeline_model_parallel_size, cp)
    tp_rank, rest = rank % tp, rank // tp
    cp_rank, rest = rest % cp, rest // cp
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

    lists = grid_rank_lists(tp, cp, dp, pp)
    groups = ProcessGroups(
        tp=build(lists["tp"]), dp=build(lists["dp"]), pp=build(lists["pp"]), mp=build(lists["mp"]),
        embd=build(lists["embd"]), tp_size=tp, dp_size=dp, pp_size=pp,
        tp_rank=tp_rank, dp_rank=dp_rank, pp_rank=pp_rank, rank=rank, world_size=world,
        pp_ranks=[grid_rank(tp_rank, dp_rank, p, tp, dp, cp_rank, cp) for p in range(pp)],
        vpp_size=virtual_pipeline_model_parallel_size, cp_size=cp, cp_rank=cp_rank)
    if cp > 1:
        groups.cp, groups.dp_cp = build(lists["cp"]), build(lists["dp_cp"])
    if expert_tensor_parallel_size in (None, tp):
        _add_expert_groups(groups, expert_model_parallel_size, build)
    else:
        _add_folded_expert_groups(groups, expert_tensor_parallel_size, expert_model_parallel_size, build)
    if pipeline_grad_group:
        add_pipeline_grad_group(groups)
    _GROUPS = groups
    return groups


def validate_expert_parallel_size(dp: int, ep: int, tp: int = 1, etp: int | None = None) -> None:
    """ParallelConfigError unless EP divides the data-parallel size (expert groups are carved out of it),
    or, folded (etp given and != tp), unless ETP x EP divides TP x DP (pass dp = DP x CP)."""
    if etp is not None and etp != tp:
        if ep < 1 or etp < 1 or (tp * dp) % (etp * ep):
            raise ParallelConfigError(
                f"--expert-tensor-parallel-size ({etp}) x --expert-model-parallel-size ({ep}) must divide "
                f"--tensor-model-parallel-size x the data-parallel size ({tp} x {dp}): the experts re-split those "
                "ranks; change them or launch more processes")
        return
    if ep < 1 or dp % ep:
        raise ParallelConfigError(
            f"--expert-model-parallel-size ({ep}) must divide the data-parallel size ({dp}): expert-parallel "
            "groups are carved out of the data-parallel ranks; change it or launch more processes")


def _add_expert_groups(g: ProcessGroups, ep: int, build) -> None:
    """Fill g.ep / g.edp (see the module docstring). Collective over the world."""
    # a (dp, cp) position as one index of the dp_cp group: grid_rank(t, j, p, tp, dp * cp) is its rank
    tp, dp, pp, j = g.tp_size, g.dp_size * g.cp_size, g.pp_size, g.cp_rank + g.cp_size * g.dp_rank
    validate_expert_parallel_size(dp, ep)
    g.ep_size, g.ep_rank, g.edp_size, g.edp_rank = ep, j % ep, dp // ep, j // ep
    if ep == 1:
        g.edp = g.dp_cp
        return
    ep_lists, edp_lists = expert_rank_lists(tp, dp, pp, ep)
    g.ep, g.edp = build(ep_lists), build(edp_lists)


def expert_rank_lists(tp: int, dp: int, pp: int, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    """(expert-parallel groups, expert-data-parallel groups) as lists of global ranks: per (tp, pp)
    position, EP consecutive DP ranks hold different experts; DP ranks EP apart hold the same ones.
    With context parallelism pass dp = DP x CP (the dp_cp index, CP fastest)."""
    cells = [(t, p) for p in range(pp) for t in range(tp)]
    return ([[grid_rank(t, d, p, tp, dp) for d in range(b, b + ep)] for t, p in cells for b in range(0, dp, ep)],
            [[grid_rank(t, d, p, tp, dp) for d in range(j, dp, ep)] for t, p in cells for j in range(ep)])


def add_pipeline_grad_group(g: ProcessGroups) -> None:
    """Fill g.pp_grad: a second group per pipeline (the ranks of g.pp), for ZB-V's gradients.

    ZB-V sends activations and gradients between the same two ranks in both directions, in
    orders that differ; one ordered channel per rank pair would match a gradient with an
    activation. NCCL keeps no p2p tags apart, so the second channel is a second communicator.
    Built on request only: a gloo group connects its ranks when made (every run would pay), an
    NCCL one is a communicator more. Collective over the world (new_group); no-op with one stage."""
    if g.pp_size == 1 or g.pp_grad is not None:
        return
    for ranks in grid_rank_lists(g.tp_size, g.cp_size, g.dp_size, g.pp_size)["pp"]:
        group = dist.new_group(ranks)
        if g.rank in ranks:
            g.pp_grad = group


def expert_grid_rank_lists(tp: int, cp: int, dp: int, pp: int, etp: int, ep: int) -> dict[str, list[list[int]]]:
    """The folded expert grid (see the module docstring) as {"etp", "ep", "edp", "tp_cp": lists of global
    ranks}: per pipeline stage the TP x CP x DP ranks re-split as ETP (fastest) x EP x EDP; tp_cp: the
    TP x CP ranks of one (dp, pp) position (they hold the parts of the same sequences)."""
    block, edp = tp * cp * dp, tp * cp * dp // (etp * ep)
    stages = [p * block for p in range(pp)]
    return {
        "etp": [[s + i + e * etp for i in range(etp)] for s in stages for e in range(edp * ep)],
        "ep": [[s + x + etp * (k + ep * d) for k in range(ep)]
               for s in stages for d in range(edp) for x in range(etp)],
        "edp": [[s + x + etp * (k + ep * d) for d in range(edp)]
                for s in stages for k in range(ep) for x in range(etp)],
        "tp_cp": [[s + d * tp * cp + i for i in range(tp * cp)] for s in stages for d in range(dp)]}


def _add_folded_expert_groups(g: ProcessGroups, etp: int, ep: int, build) -> None:
    """Fill the expert groups of the folded grid (ETP != TP). Collective over the world."""
    dp = g.dp_size * g.cp_size
    validate_expert_parallel_size(dp, ep, g.tp_size, etp)
    i = g.tp_rank + g.tp_size * (g.cp_rank + g.cp_size * g.dp_rank)
    g.etp_size, g.etp_rank, g.ep_size, g.ep_rank = etp, i % etp, ep, (i // etp) % ep
    g.edp_size, g.edp_rank, g.expert_folded = g.tp_size * dp // (etp * ep), i // (etp * ep), True
    lists = expert_grid_rank_lists(g.tp_size, g.cp_size, g.dp_size, g.pp_size, etp, ep)
    g.etp, g.ep, g.edp, g.tp_cp = (build(lists[k]) for k in ("etp", "ep", "edp", "tp_cp"))


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
