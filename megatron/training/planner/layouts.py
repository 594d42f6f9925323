"""The layouts the planner tries: each parallelism or memory choice is one Dimension.

A layout is a dict {dimension name: value}; its command line is the concatenation of each
dimension's flags. A new dimension (context parallel, expert parallel, a ZeRO stage) is one more
Dimension in DIMENSIONS: what it allows given the choices made before it, and its flags. Whether a
combination is valid is decided by the same resolve/validate as training (predict.py), not here.
"""
import dataclasses
from collections.abc import Callable, Iterable

from ...core.errors import ParallelConfigError
from ...core.parallel_layout import ParallelLayout, data_parallel_size


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
class Dimension:
    name: str
    choices: Callable[[Space, dict], Iterable]   # (space, choices so far) -> values
    flags: Callable[[object, dict], list]        # (value, whole layout) -> command-line flags


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def data_parallel(space: Space, layout: dict) -> int:
    """GPUs over the model-parallel ones (TP x PP x CP; EP splits the experts over DP x CP instead)."""
    return data_parallel_size(space.num_gpus, layout["tp"], layout.get("cp", 1), layout["pp"])


def _fits(space: Space, layout: dict, **sizes) -> bool:
    """The ParallelLayout of the choices so far (and `sizes`) can be built on the cluster's GPUs."""
    try:
        ParallelLayout(space.num_gpus, layout["tp"], sizes.get("cp", layout.get("cp", 1)), layout["pp"],
                       ep=sizes.get("ep", 1))
    except ParallelConfigError:
        return False
    return True


def _tp(space, _):
    return [t for t in _divisors(space.num_gpus) if t & (t - 1) == 0 and t <= space.gpus_per_node
            and space.num_heads % t == 0 and space.num_query_groups % t == 0]


def _pp(space, lay):
    return [p for p in _divisors(space.num_gpus // lay["tp"]) if p <= space.num_layers]


def _cp(space, lay):
    """Context parallel sizes (powers of two up to 8 splitting the sequence into 2 C chunks); by
    default only for sequences of 8192 tokens or more, where the s x s attention starts to dominate."""
    if not space.full and space.seq_length < 8192:
        return [1]
    return [c for c in (1, 2, 4, 8) if _fits(space, lay, cp=c) and space.seq_length % (2 * c) == 0]


def _cp_comm(space, lay):
    if lay["cp"] == 1:
        return [None]
    return ["p2p", "all_gather", "a2a"] if space.full else ["p2p"]


def _ep(space, lay):
    """Expert parallel sizes of an MoE model: powers of two dividing the experts and DP x CP."""
    if not space.num_experts:
        return [1]
    return [e for e in (1, 2, 4, 8, 16, 32, 64) if space.num_experts % e == 0 and _fits(space, lay, ep=e)]


def _vpp(space, lay):
    if lay["pp"] == 1:
        return [1]
    per_stage = space.num_layers // lay["pp"]
    return [v for v in _divisors(per_stage) if v <= 8] if space.num_layers % lay["pp"] == 0 else [1]


def _mb(space, lay):
    dp = data_parallel(space, lay)
    if space.global_batch_size % dp:
        return []
    return [b for b in (1, 2, 4, 8, 16) if (space.global_batch_size // dp) % b == 0]


def _sp(space, lay):
    if lay["tp"] == 1:
        return [False]
    return [False, True] if space.full else [True]


def _dist_opt(space, lay):
    if data_parallel(space, lay) == 1:
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
              ["--num-layers-per-virtual-pipeline-stage", str(lay["layers"] // (lay["pp"] * v))]),
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


def enumerate_layouts(space: Space, fixed=None):
    """Every combination of the dimensions' choices, as dicts; fixed {name: value} pins dimensions."""
    fixed = fixed or {}
    out = [{"layers": space.num_layers}]
    for dim in DIMENSIONS:
        grown = []
        for lay in out:
            values = [fixed[dim.name]] if dim.name in fixed else list(dim.choices(space, lay))
            grown += [{**lay, dim.name: v} for v in values]
        out = grown
    for lay in out:
        lay["dp"] = data_parallel(space, lay)
    return out


def layout_flags(layout: dict) -> list[str]:
    """The layout's command-line flags (pretrain_gpt.py's); --overlap-grad-reduce whenever DP > 1."""
    flags = [f for dim in DIMENSIONS for f in dim.flags(layout[dim.name], layout)]
    return flags + (["--overlap-grad-reduce"] if layout["dp"] > 1 else [])


def describe(layout: dict) -> str:
    """Short label: TP2 PP4 VPP2 DP8 mb1 SP DO rec=full."""
    parts = [f"TP{layout['tp']}", f"PP{layout['pp']}"] + ([f"VPP{layout['vpp']}"] if layout["vpp"] > 1 else [])
    if layout.get("cp", 1) > 1:
        parts.append(f"CP{layout['cp']}" + {"all_gather": "ag", "a2a": "a2a"}.get(layout["cp_comm"], ""))
    if layout.get("ep", 1) > 1:
        parts.append(f"EP{layout['ep']}")
    parts += [f"DP{layout['dp']}", f"mb{layout['mb']}"] + (["SP"] if layout["sp"] else [])
    zero = {"optim": [], "optim_grads": ["Z2"], "optim_grads_params": ["Z3"]}.get(layout.get("zero"), [])
    parts += (["DO"] if layout["dist_opt"] else []) + zero
    parts += [f"rec={layout['recompute']}"] if layout["recompute"] else []
    parts += ["FP8"] if layout.get("fp8") else []
    return " ".join(parts)
