"""The layouts the planner tries: each parallelism or memory choice is one Dimension.

A candidate is a ParallelLayout (TP, PP, CP, EP, virtual stages, SP; sizes that make none are not
offered) with the other dimensions' choices; its command line is the concatenation of each dimension's flags.
A new dimension (context parallel, expert parallel, a ZeRO stage) is one more Dimension in DIMENSIONS: what
it allows given the choices made before it, and its flags. Whether a combination is valid is decided by the
same resolve/validate as training (predict.py), not here.
"""
import dataclasses
from collections.abc import Callable, Iterable

from ...core.errors import ParallelConfigError
from ...core.parallel_layout import ParallelLayout


@dataclasses.dataclass(frozen=True)
class Space:
    """What the choices may depend on: the model's sizes, the cluster, the global batch."""
    num_gpus: int
    gpus_per_node: int
    num_layers: int
    num_heads: int
    num_query_groups: int
    global_batch_size: int
    full: bool  # enumerate dominated choices too (SP off with TP, no distributed optimizer with DP)
    seq_length: int = 0
    num_experts: int = 0  # 0: a dense model
    fp8: bool = False  # also try --fp8-format hybrid --fp8-recipe tensorwise (the GPU has FP8 tensor cores)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One layout the planner tries: the ParallelLayout of its sizes (TP, PP, CP, EP, virtual stages, SP) and
    the other dimensions' choices; cand[name] reads either (vpp: 1 for one chunk)."""
    layout: ParallelLayout
    layers: int
    choices: tuple = ()  # ((dimension name, value), ...) of the dimensions that are not sizes

    def __getitem__(self, name):
        if name == "sp":
            return self.layout.sequence_parallel
        if name in FIELDS:
            return getattr(self.layout, FIELDS[name]) or 1
        return dict(self.choices)[name]

    def grown(self, name, value):
        """This candidate with dimension `name` chosen; None where the sizes make no ParallelLayout."""
        if name not in FIELDS:
            return dataclasses.replace(self, choices=self.choices + ((name, value),))
        try:
            size = None if name == "vpp" and value == 1 else value
            # expert TP is not searched: None keeps it TP's (the layout fills it in)
            layout = dataclasses.replace(self.layout, etp=None, **{FIELDS[name]: size})
        except ParallelConfigError:
            return None
        return dataclasses.replace(self, layout=layout)


# the dimensions that are ParallelLayout fields, and their field
FIELDS = {"tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "vpp": "vpp", "sp": "sequence_parallel"}


@dataclasses.dataclass(frozen=True)
class Dimension:
    name: str
    choices: Callable[[Space, Candidate], Iterable]   # (space, choices so far) -> values
    flags: Callable[[object, Candidate], list]        # (value, whole candidate) -> command-line flags


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _fits(lay: Candidate, name, value) -> bool:
    """The candidate's ParallelLayout with `name` = value can be built on the cluster's GPUs."""
    return lay.grown(name, value) is not None


def _tp(space, lay):
    return [t for t in _divisors(space.num_gpus) if t & (t - 1) == 0 and t <= space.gpus_per_node
            and space.num_heads % t == 0 and space.num_query_groups % t == 0]


def _pp(space, lay):
    return [p for p in range(1, space.num_layers + 1) if _fits(lay, "pp", p)]


def _cp(space, lay):
    """Context parallel sizes (powers of two up to 8 splitting the sequence into 2 C chunks); by
    default only for sequences of 8192 tokens or more, where the s x s attention starts to dominate."""
    if not space.full and space.seq_length < 8192:
        return [1]
    return [c for c in (1, 2, 4, 8) if _fits(lay, "cp", c) and space.seq_length % (2 * c) == 0]


def _cp_comm(space, lay):
    if lay.layout.cp == 1:
        return [None]
    return ["p2p", "all_gather", "a2a"] if space.full else ["p2p"]


def _ep(space, lay):
    """Expert parallel sizes of an MoE model: powers of two dividing the experts and DP x CP."""
    if not space.num_experts:
        return [1]
    return [e for e in (1, 2, 4, 8, 16, 32, 64) if space.num_experts % e == 0 and _fits(lay, "ep", e)]


def _vpp(space, lay):
    pp = lay.layout.pp
    if pp == 1:
        return [1]
    return [v for v in _divisors(space.num_layers // pp) if v <= 8] if space.num_layers % pp == 0 else [1]


def _mb(space, lay):
    dp = lay.layout.dp
    if space.global_batch_size % dp:
        return []
    return [b for b in (1, 2, 4, 8, 16) if (space.global_batch_size // dp) % b == 0]


def _sp(space, lay):
    if lay.layout.tp == 1:  # nothing to split over (ParallelLayout.sequence_split)
        return [False]
    return [False, True] if space.full else [True]


def _dist_opt(space, lay):
    if lay.layout.dp == 1:
        return [False]
    return [False, True] if space.full else [True]


def _zero(space, lay):
    """ZeRO stage over the distributed optimizer: optim (1), optim_grads (2), optim_grads_params (3).
    ZeRO-2 moves the bytes ZeRO-1 moves and holds less, so ZeRO-1 is tried only with --search full.
    With EP the expert buffers are sharded over expert-DP (cost.dp_groups), the dense ones over DP x CP."""
    if not lay["dist_opt"]:
        return ["no_shard"]
    return ["optim", "optim_grads", "optim_grads_params"] if space.full else ["optim_grads", "optim_grads_params"]


FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]  # Megatron-LM's recipes' choice


DIMENSIONS = [
    Dimension("tp", _tp, lambda v, _: ["--tensor-model-parallel-size", str(v)]),
    Dimension("pp", _pp, lambda v, _: ["--pipeline-model-parallel-size", str(v)]),
    Dimension("cp", _cp, lambda v, _: [] if v == 1 else
              ["--context-parallel-size", str(v), "--attention-dropout", "0"]),
    Dimension("cp_comm", _cp_comm, lambda v, _: ["--cp-comm-type", v] if v else []),
    Dimension("ep", _ep, lambda v, _: [] if v == 1 else
              ["--expert-model-parallel-size", str(v), "--moe-token-dispatcher-type", "alltoall"]),
    Dimension("vpp", _vpp, lambda v, lay: [] if v == 1 else
              ["--num-layers-per-virtual-pipeline-stage", str(lay.layers // (lay.layout.pp * v))]),
    Dimension("mb", _mb, lambda v, _: ["--micro-batch-size", str(v)]),
    Dimension("sp", _sp, lambda v, _: ["--sequence-parallel"] if v else []),
    Dimension("dist_opt", _dist_opt, lambda v, lay: ["--use-distributed-optimizer", "--overlap-param-gather"] if v
              else []),
    Dimension("zero", _zero, lambda v, _: [] if v in ("no_shard", "optim") else
              ["--data-parallel-sharding-strategy", v]),
    Dimension("recompute", lambda s, _: [None, "selective", "full"],
              lambda v, _: ["--recompute-granularity", v] if v else []),
    Dimension("fp8", lambda s, _: [False, True] if s.fp8 else [False], lambda v, _: FP8 if v else []),
]


def enumerate_layouts(space: Space, fixed=None) -> list[Candidate]:
    """Every combination of the dimensions' choices whose sizes make a ParallelLayout of space.num_gpus
    ranks, as Candidates; fixed {name: value} pins dimensions."""
    fixed = fixed or {}
    out = [Candidate(ParallelLayout(space.num_gpus), space.num_layers)]
    for dim in DIMENSIONS:
        grown = []
        for lay in out:
            values = [fixed[dim.name]] if dim.name in fixed else list(dim.choices(space, lay))
            grown += [g for g in (lay.grown(dim.name, v) for v in values) if g is not None]
        out = grown
    return out


def layout_flags(cand: Candidate) -> list[str]:
    """The candidate's command-line flags (pretrain_gpt.py's); --overlap-grad-reduce whenever DP > 1."""
    flags = [f for dim in DIMENSIONS for f in dim.flags(cand[dim.name], cand)]
    return flags + (["--overlap-grad-reduce"] if cand.layout.dp > 1 else [])


def describe(cand: Candidate) -> str:
    """Short label: TP2 PP4 VPP2 DP8 mb1 SP DO rec=full."""
    lay = cand.layout
    parts = [f"TP{lay.tp}", f"PP{lay.pp}"] + ([f"VPP{lay.vpp}"] if (lay.vpp or 1) > 1 else [])
    if lay.cp > 1:
        parts.append(f"CP{lay.cp}" + {"all_gather": "ag", "a2a": "a2a"}.get(cand["cp_comm"], ""))
    if lay.ep > 1:
        parts.append(f"EP{lay.ep}")
    parts += [f"DP{lay.dp}", f"mb{cand['mb']}"] + (["SP"] if lay.sequence_split else [])
    zero = {"optim": [], "optim_grads": ["Z2"], "optim_grads_params": ["Z3"]}.get(cand["zero"], [])
    parts += (["DO"] if cand["dist_opt"] else []) + zero
    parts += [f"rec={cand['recompute']}"] if cand["recompute"] else []
    parts += ["FP8"] if cand["fp8"] else []
    return " ".join(parts)
