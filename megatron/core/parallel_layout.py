"""The parallel layout: every size, derived size, grid position and group rank list, in one place.

Built once from the resolved config, before any process group exists (ParallelLayout.from_config);
build_groups() then makes this rank's groups (process_groups.ProcessGroups). Nothing else computes
DP, DP x CP, expert-DP, "are the experts folded" or a rank list.

Two grids over the same ranks, each written as an order string, fastest-varying first (Megatron-Core's):

    dense   tp-cp-dp-pp     global_rank = tp + TP x (cp + CP x (dp + DP x pp))
    experts etp-ep-edp-pp   the TP x CP x DP ranks of a pipeline stage re-split as ETP x EP x EDP

so a TP group is a run of TP consecutive ranks (inside a node when TP divides the GPUs per node), and
expert parallelism is carved out of the data-parallel ranks: EP x EDP x ETP = TP x CP x DP. At ETP = TP
the expert grid keeps TP and re-splits CP x DP as EP x EDP (EP consecutive DP x CP ranks hold different
experts); at ETP != TP the experts are folded (Megatron-Core's MoE parallel folding): EP may span TP
ranks, expert TP may span DP ranks. Folded is a fact of the two grids (etp != tp), not a flag.
Example, 8 ranks with TP=2, PP=2 (DP=2): TP [0,1] [2,3] [4,5] [6,7], DP [0,2] [1,3] [4,6] [5,7],
PP [0,4] [1,5] [2,6] [3,7], MP (TP x PP, one model replica) [0,1,4,5] [2,3,6,7].
"""
from __future__ import annotations

import dataclasses
import functools

import torch.distributed as dist

from .comm import PlanGroup
from .layout_checks import check_dense, check_experts
from .layout_experts import ExpertRows
from .process_groups import ProcessGroups

DENSE, EXPERT = "tp-cp-dp-pp", "etp-ep-edp-pp"
# group name -> (grid, the dimensions its ranks differ in); embd and pp_grad are made from pp
GROUPS = {"tp": (DENSE, "tp"), "cp": (DENSE, "cp"), "dp": (DENSE, "dp"), "pp": (DENSE, "pp"),
          "mp": (DENSE, "tp-pp"), "dp_cp": (DENSE, "cp-dp"), "tp_cp": (DENSE, "tp-cp"),
          "etp": (EXPERT, "etp"), "ep": (EXPERT, "ep"), "edp": (EXPERT, "edp")}
# a group that is not built is the group of the same ranks named here (dp_cp at CP 1, etp and, at EP 1,
# edp when the experts are not folded), or None (no such group: cp at CP 1, ep at EP 1, tp_cp unfolded)
SAME_RANKS = {"dp_cp": "dp", "etp": "tp", "edp": "dp_cp"}


def rank_lists(order: str, sizes: dict, group: str) -> list[list[int]]:
    """The global ranks of every group whose members differ only in the dimensions of `group` ("cp-dp")
    of the grid `order` ("tp-cp-dp-pp", fastest first): groups by their first rank, ranks ascending."""
    dims = order.split("-")
    inside = group.split("-")
    if not set(inside) <= set(dims):
        raise ValueError(f"group {group!r} is not in the grid {order!r}")
    stride, step = {}, 1
    for d in dims:
        stride[d], step = step, step * sizes[d]

    def offsets(names):  # fastest first: each next dimension is slower, so the list stays ascending
        out = [0]
        for d in names:
            out = [o + k * stride[d] for k in range(sizes[d]) for o in out]
        return out

    members = offsets([d for d in dims if d in inside])
    return [[base + m for m in members] for base in offsets([d for d in dims if d not in inside])]


def coordinates(order: str, sizes: dict, rank: int) -> dict:
    """{dimension: index} of global `rank` in the grid `order` (fastest first)."""
    out = {}
    for d in order.split("-"):
        out[d], rank = rank % sizes[d], rank // sizes[d]
    return out


def experts_folded(tp: int, etp: int | None) -> bool:
    """An expert TP given and other than TP: the expert grid re-splits TP (MoE parallel folding)."""
    return etp is not None and etp != tp


def expert_tensor_parallel(tp: int, etp: int | None) -> int:
    """Expert TP: --expert-tensor-parallel-size where given, else TP (Megatron-Core's default)."""
    return tp if etp is None else etp


def sequence_multiple(tp: int, cp: int) -> int:
    """The multiple a sequence is padded to under CP: 2 x CP chunks (a CP rank holds two, balancing causal
    attention's work), each split evenly over TP by sequence parallelism."""
    return 2 * cp * tp


def sequence_split(sequence_parallel: bool, tp: int) -> bool:
    """Sequence parallelism in effect: --sequence-parallel and TP > 1 (one TP rank has nothing to split over)."""
    return bool(sequence_parallel) and tp > 1


def data_parallel_size(world: int, tp: int, cp: int = 1, pp: int = 1) -> int:
    """world / (TP x CP x PP), at least 1 (ParallelLayout refuses a world they do not divide)."""
    return max(1, world // (tp * cp * pp))


@dataclasses.dataclass(frozen=True)
class Position:
    """One rank's index along every dimension of both grids."""
    tp: int
    cp: int
    dp: int
    pp: int
    etp: int
    ep: int
    edp: int


@dataclasses.dataclass(frozen=True)
class ParallelLayout(ExpertRows):
    """The sizes of a run: world, TP, CP, PP, the interleaved schedule's model chunks per pipeline rank
    (vpp, None for one), EP and expert TP (None: TP), the pipeline schedule (a SCHEDULES name, from
    schedule_flag.schedule_for_flag; None: the default for the layout) and whether SP is asked for. ZB-V
    ("zb_v") puts two chunks per rank in a V, whose gradients travel over a second pipeline group (pp_grad). Raises
    ParallelConfigError, naming the flags and the fix, for sizes that do not fit the world."""
    world: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int | None = None
    ep: int = 1
    etp: int | None = None
    schedule: str | None = None
    sequence_parallel: bool = False  # --sequence-parallel as asked; sequence_split: in effect

    def __post_init__(self):
        check_dense(self.world, self.tp, self.cp, self.pp, self.vpp)
        object.__setattr__(self, "etp", expert_tensor_parallel(self.tp, self.etp))
        check_experts(self.tp, self.dp_cp, self.ep, self.etp, self.experts_folded)

    @classmethod
    def from_config(cls, config, world: int, schedule: str | None = None) -> ParallelLayout:
        """The layout of a TransformerConfig's parallel sizes on `world` ranks (expert TP only with experts)."""
        c = config
        return cls(world, c.tensor_model_parallel_size, c.context_parallel_size, c.pipeline_model_parallel_size,
                   c.virtual_pipeline_model_parallel_size, c.expert_model_parallel_size,
                   c.expert_tensor_parallel_size if c.num_experts else None, schedule, c.sequence_parallel)

    # ---- the pipeline
    @property
    def v_shape(self) -> bool:
        """ZB-V: two model chunks per rank in a V (pipeline_parallel/split.py), gradients over pp_grad."""
        return self.schedule == "zb_v" and self.pp > 1

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank: 2 in ZB-V's V, vpp with the interleaved schedule, else 1."""
        return 2 if self.v_shape else self.vpp or 1

    @property
    def virtual_stages(self) -> int | None:
        """chunks, None for one (Megatron-LM's virtual pipeline size)."""
        return self.chunks if self.chunks > 1 else None

    # ---- derived sizes
    @property
    def dp(self) -> int:
        return data_parallel_size(self.world, self.tp, self.cp, self.pp)

    @property
    def dp_cp(self) -> int:
        """DP x CP: the ranks holding the same parameters, over which gradients and loss sums are reduced."""
        return self.dp * self.cp

    @property
    def sequence_split(self) -> bool:
        """Activations outside the TP regions split along the sequence over TP (sequence_split())."""
        return sequence_split(self.sequence_parallel, self.tp)

    @property
    def sequence_multiple(self) -> int:
        """What each sequence is padded to under CP (sequence_multiple())."""
        return sequence_multiple(self.tp, self.cp)

    @property
    def stage_ranks(self) -> int:
        """TP x CP x DP: the ranks of one pipeline stage (consecutive; stages are this many ranks apart)."""
        return self.tp * self.dp_cp

    @property
    def edp(self) -> int:
        """Expert-DP: the ranks of a stage holding the same experts, TP x CP x DP / (ETP x EP)."""
        return self.stage_ranks // (self.etp * self.ep)

    @property
    def experts_folded(self) -> bool:
        """The expert grid re-splits TP (expert TP != TP): each TP rank routes its own tokens."""
        return experts_folded(self.tp, self.etp)

    @property
    def expert_dp_apart(self) -> bool:
        """The experts have an expert-DP group of their own (EP > 1, or folded): their gradients get
        buffers of their own, reduced over it."""
        return self.ep > 1 or self.experts_folded

    def sizes(self, grid: str) -> dict:
        return ({"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp} if grid == DENSE
                else {"etp": self.etp, "ep": self.ep, "edp": self.edp, "pp": self.pp})

    # ---- ranks
    def position(self, rank: int) -> Position:
        return Position(**coordinates(DENSE, self.sizes(DENSE), rank), **{
            k: v for k, v in coordinates(EXPERT, self.sizes(EXPERT), rank).items() if k != "pp"})

    def rank_lists(self, name: str) -> list[list[int]]:
        """Every group of kind `name` (a GROUPS name, embd or pp_grad) as lists of global ranks."""
        if name in ("embd", "pp_grad"):
            pp = self.rank_lists("pp")
            return [sorted({r[0], r[-1]}) for r in pp] if name == "embd" else pp
        if name == "ecp":
            return self._ecp_lists
        grid, dims = GROUPS[name]
        return rank_lists(grid, self.sizes(grid), dims)

    # ---- groups by name (GROUPS, embd, pp_grad, ecp): their size and reach, what the planner prices
    def group_size(self, name: str) -> int:
        """Ranks in a group of kind `name` (the largest, for ecp's sets; embd: 1 at PP 1)."""
        if name in GROUPS:
            grid, dims = GROUPS[name]
            return functools.reduce(lambda n, d: n * self.sizes(grid)[d], dims.split("-"), 1)
        if name in ("embd", "pp_grad"):
            return min(self.pp, 2) if name == "embd" else self.pp
        return max(len(r) for r in self.rank_lists(name))

    def stride(self, name: str) -> int:
        """Global-rank distance between neighbouring members of a group of kind `name` (its fastest
        dimension's; embd: first stage to last, TP x CP x DP x (PP - 1)); 1 for a one-rank group."""
        ranks = self.rank_lists(name)[0]
        return ranks[1] - ranks[0] if len(ranks) > 1 else 1

    def crosses_node(self, name: str, gpus_per_node: int) -> bool:
        """Some group of kind `name` has ranks on two nodes of gpus_per_node consecutive ranks."""
        return any(r[0] // gpus_per_node != r[-1] // gpus_per_node for r in self.rank_lists(name))

    def stages_cross_node(self, a: int, b: int, gpus_per_node: int) -> bool:
        """Some rank of pipeline stage a and its peer on stage b (the same TP, CP, DP position; stages are
        stage_ranks apart) lie on two nodes of gpus_per_node consecutive ranks."""
        n = self.stage_ranks
        return any((o + a * n) // gpus_per_node != (o + b * n) // gpus_per_node for o in range(n))

    def rank_in(self, name: str, rank: int) -> int | None:
        """`rank`'s index in its group of kind `name` (None: in none)."""
        ranks = self.group_of(name, rank)
        return None if ranks is None else ranks.index(rank)

    def group_of(self, name: str, rank: int) -> list[int] | None:
        """The ranks of `rank`'s group of kind `name` (None: not in one, a middle stage's embd)."""
        return next((r for r in self.rank_lists(name) if rank in r), None)

    def built(self) -> list[str]:
        """The groups build_groups() makes, in order; the others are SAME_RANKS' or absent."""
        names = ["tp", "dp", "pp", "mp", "embd"] + (["cp", "dp_cp"] if self.cp > 1 else [])
        if self.experts_folded:
            names += ["etp", "ep", "edp", "tp_cp"]
        elif self.ep > 1:
            names += ["ep", "edp"]
        names += ["ecp"] if self._ecp_alias(names) is None else []
        return names + (["pp_grad"] if self.v_shape and self.pp > 1 else [])

    def build_groups(self) -> ProcessGroups:
        """This rank's groups (torch.distributed must be up with `world` ranks). Collective: every rank
        makes every group, in the same order, and keeps the ones it is in."""
        if dist.get_world_size() != self.world:
            raise ValueError(f"the layout is for {self.world} ranks, torch.distributed has {dist.get_world_size()}")
        rank = dist.get_rank()

        def build(lists):
            mine = None
            for ranks in lists:
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine = group
            return mine
        return self._groups(rank, {name: build(self.rank_lists(name)) for name in self.built()})

    def plan_groups(self, rank: int = 0) -> ProcessGroups:
        """Rank `rank`'s groups as stand-ins with no processes behind them (comm.PlanGroup): to build its
        model shard on the meta device, or to test in one process. Any collective on them fails."""
        mine = {name: self.group_of(name, rank) for name in self.built()}
        return self._groups(rank, {name: PlanGroup(len(r), r.index(rank)) if r else None for name, r in mine.items()})

    def _groups(self, rank, made):
        for name, same in SAME_RANKS.items():
            if name not in made:
                made[name] = made[same]
        if "ecp" not in made:  # the same ranks as cp (EP 1) or tp_cp (folded, EP 1), or one rank each
            made["ecp"] = made.get(self._ecp_alias(made) or "", None)
        return ProcessGroups(self, rank, **{name: made.get(name) for name in ProcessGroups.NAMES})

    def describe(self) -> str:
        v = f" (virtual stages {self.chunks})" if self.chunks > 1 else ""
        cp, order = (f" x CP {self.cp}", "tp-cp-dp-pp") if self.cp > 1 else ("", "tp-dp-pp")
        line = (f"world {self.world} = TP {self.tp}{cp} x DP {self.dp} x PP {self.pp}{v}; rank order {order} "
                "(TP ranks adjacent)")
        if self.experts_folded:  # the experts re-split TP x CP x DP (parallel folding)
            return line + f"; experts folded over expert-TP {self.etp} x EP {self.ep} x expert-DP {self.edp}"
        return line + (f"; experts over EP {self.ep} x expert-DP {self.edp}" if self.ep > 1 else "")
