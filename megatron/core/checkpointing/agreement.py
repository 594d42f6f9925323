"""A save's steps, each run by every rank with one outcome: a step that fails on any rank fails on all.

A save is three steps (rank 0 makes iter_X.tmp/; every rank writes its file into it; rank 0 commits),
each followed by a collective. Were that a barrier, a rank whose write failed (a full disk, a quota)
would raise alone while the others wait at the barrier until the watchdog calls them hung, and the
rank that knows why might not be the one that prints. Here each rank brings its CheckpointError, or
None, to an all-gather of the messages instead. When any rank failed, rank 0 removes the partial
directory (no rank writes into it any more: all are here) and every rank raises the lowest failing
rank's error, so every rank stops alike and one line reaches the user (training/loop/launch.py).
"""
import torch.distributed as dist

from .pieces import CheckpointError
from .storage import abandon_save


def save_step(run, root, iteration, rank, group=None):
    """run() on this rank (it may do nothing here), then agree over `group` (None: the default group).
    Raises the first failing rank's CheckpointError on every rank of the group."""
    mine = None
    try:
        run()
    except CheckpointError as e:
        mine = str(e)
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    first = next((e for e in every if e is not None), None)
    if first is not None:
        if rank == 0:
            abandon_save(root, iteration)
        raise CheckpointError(first)
