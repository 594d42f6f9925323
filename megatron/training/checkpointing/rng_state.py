"""The RNG states in a checkpoint (--no-load-rng skips their restore).

Each rank saves its generators (the CPU default, CUDA's, the tracker's tensor-parallel state) with
its position in the layout: every group's size and its rank in each. A resume restores them only
when every rank holds the very position it had when saved (all ranks decide together): a stream
then continues on the rank that drew it, bitwise. Otherwise no saved stream belongs to its new
owner (a change of CP, EP or expert TP moves ranks as much as one of TP, PP or DP), so every rank
reseeds by model_parallel_seed's rule from --seed plus the iteration (streams of replicated
activations equal over a TP group, those of TP-split ones per TP rank), and one line says so.
"""
import torch
import torch.distributed as dist

from ...core.checkpointing import rank_file
from ...core.tensor_parallel.random import get_rng_tracker, model_parallel_seed
from ..observability.log import print_rank_0

GROUPS = ("world", "tp", "cp", "dp", "pp", "vpp", "ep", "etp", "edp")


def layout_position(groups) -> dict:
    """{group: (size, this rank's rank in it)} for every group of the layout (vpp: chunks per rank,
    all of them on this rank), read off groups.layout (ParallelLayout) and this rank's position in it.
    The one place checkpoints read layout facts."""
    lay, pos = groups.layout, groups.layout.position(groups.rank)
    return {"world": (lay.world, groups.rank), "tp": (lay.tp, pos.tp), "cp": (lay.cp, pos.cp),
            "dp": (lay.dp, pos.dp), "pp": (lay.pp, pos.pp), "vpp": (lay.chunks, 0), "ep": (lay.ep, pos.ep),
            "etp": (lay.etp, pos.etp), "edp": (lay.edp, pos.edp)}


def layout_sizes(position: dict) -> dict:
    """{group: size}: the layout, the same on every rank (the checkpoint's metadata records it)."""
    return {name: size for name, (size, _) in position.items()}


def _vector(position: dict) -> torch.Tensor:
    """The position as int64 [size, rank] pairs in GROUPS order: a tensor, as the checkpoint index keeps."""
    return torch.tensor([v for name in GROUPS for v in position[name]], dtype=torch.int64)


def _describe(vector: torch.Tensor) -> str:
    sizes = vector.view(-1, 2)[:, 0].tolist()
    return " ".join(f"{name.upper()}{n}" for name, n in zip(GROUPS, sizes))


def rng_payload(groups, device) -> dict:
    """This rank's generators and its layout position, for its rank file."""
    state = {"torch": torch.get_rng_state(), "tracker": get_rng_tracker().get_states(),
             "position": _vector(layout_position(groups))}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_or_reseed(reader, groups, train_cfg, device, iteration) -> bool:
    """Collective over the world group. True when every rank restored its saved states; else every
    rank reseeded (model_parallel_seed(--seed + iteration)) and rank 0 printed why."""
    position = layout_position(groups)
    mine = _vector(position)
    rng = reader.rng_state(rank_file(groups.rank))
    saved = None if rng is None else rng.get("position")
    same = torch.tensor([float(saved is not None and torch.equal(saved.cpu().to(torch.int64), mine))], device=device)
    if groups.world_size > 1:
        dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if same.item() == 1.0:
        torch.set_rng_state(rng["torch"])
        get_rng_tracker().set_states(rng["tracker"])
        if device.type == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"], device)
        return True
    model_parallel_seed(train_cfg.seed + iteration, position["tp"][1], position["pp"][1], device)
    if saved is None:
        why = "the checkpoint records no layout position for this rank (saved by an older version, or fewer ranks)"
    elif _describe(saved) != _describe(mine):
        why = f"saved at {_describe(saved)}, resumed at {_describe(mine)}"
    else:
        why = f"the layout {_describe(mine)} is the same, but a rank's position in it differs"
    print_rank_0(f"> RNG states reseeded on every rank from --seed {train_cfg.seed} + iteration {iteration}, "
                 f"not restored: {why}")
    return False
