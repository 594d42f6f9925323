"""RNG restore (training/checkpointing/rng_state.py) on 2 gloo ranks at TP2: the saved states come back only
when every rank holds its saved position, and all ranks decide together; otherwise every rank
reseeds by model_parallel_seed's rule, so the stream replicated activations draw from (the default
generator) is the same on both ranks of the TP group and the TP-split one (the tracker's) is not.
The CLI test is tests/functional/test_checkpoint_rng.py."""
import types

import torch

from megatron.core.tensor_parallel.random import get_rng_tracker, model_parallel_seed
from megatron.training.checkpointing.rng_state import restore_or_reseed, rng_payload
from tests.harness import spawn

SEED, ITERATION = 11, 6


class _Reader:
    """rng_state(rank file) of a checkpoint whose rank files hold `payloads` (one per rank)."""

    def __init__(self, payloads):
        self.payloads = payloads

    def rng_state(self, name):
        rank = int(name.split("_")[-1].split(".")[0])
        return self.payloads[rank] if rank < len(self.payloads) else None


def _states():
    return torch.get_rng_state(), get_rng_tracker().get_states()["model-parallel-rng"]


def _case(groups, edit):
    """Save, draw on, then restore from a checkpoint whose payloads `edit` changed: -> (restored,
    default state equal to the saved one, tracker equal to the saved one, default state, tracker state)."""
    cpu = torch.device("cpu")
    model_parallel_seed(3, groups.tp_rank, groups.pp_rank, cpu)
    torch.rand(7)
    with get_rng_tracker().fork():
        torch.rand(5)
    saved = rng_payload(groups, cpu)
    payloads = [None] * groups.world_size
    torch.distributed.all_gather_object(payloads, saved)
    payloads = edit(payloads)
    torch.rand(3)  # training went on after the save
    with get_rng_tracker().fork():
        torch.rand(3)
    cfg = types.SimpleNamespace(seed=SEED)
    restored = restore_or_reseed(_Reader(payloads), groups, cfg, cpu, ITERATION)
    default, tracker = _states()
    same_tracker = torch.equal(tracker, saved["tracker"]["model-parallel-rng"])
    return restored, torch.equal(default, saved["torch"]), same_tracker, default, tracker


def _swap_positions(payloads):  # same sizes, but the ranks' places exchanged (another rank order)
    a, b = (dict(p) for p in payloads)
    a["position"], b["position"] = b["position"], a["position"]
    return [a, b]


def _one_without_position(payloads):  # rank 1's file from a version that recorded no position
    return [payloads[0], {k: v for k, v in payloads[1].items() if k != "position"}]


def _other_cp(payloads):  # rank 1's file from a layout with another CP size (its vector's cp size)
    b = dict(payloads[1])
    b["position"] = b["position"].clone()
    b["position"][4] = 2
    return [payloads[0], b]


def _run(groups):
    out = {"same": _case(groups, lambda p: p)[:3]}
    reseeded = {}
    for name, edit in (("swapped", _swap_positions), ("no position", _one_without_position), ("cp", _other_cp)):
        restored, _, _, default, tracker = _case(groups, edit)
        model_parallel_seed(SEED + ITERATION, groups.tp_rank, groups.pp_rank, torch.device("cpu"))
        want = _states()
        # states as lists: a tensor sent to the parent needs its sender alive when it is received
        reseeded[name] = (restored, torch.equal(default, want[0]) and torch.equal(tracker, want[1]), default.tolist(),
                          tracker.tolist())
    out["reseeded"] = reseeded
    return out


def test_restore_only_at_the_same_position_on_every_rank_else_reseed_alike():
    ranks = spawn(2, _run, tp=2)
    for r, got in enumerate(ranks):
        assert got["same"] == (True, True, True), (r, got["same"])
        for name, (restored, as_seeded, _, _) in got["reseeded"].items():
            assert not restored and as_seeded, (r, name)  # every rank, even the one whose position matched
    for name in ranks[0]["reseeded"]:
        (_, _, d0, t0), (_, _, d1, t1) = ranks[0]["reseeded"][name], ranks[1]["reseeded"][name]
        assert d0 == d1, name  # replicated activations draw the same dropout masks on the TP group
        assert t0 != t1, name  # TP-split ones their own
