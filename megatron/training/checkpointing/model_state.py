"""The model's non-trained state in a checkpoint (transformer/model_state.py: the MoE routers' expert
bias, FP8 delayed scaling's amax histories and scales): saved beside the parameters as state "buffer"
of each tensor's layout-free key.

Each tensor is replicated over the ranks holding its layer, so it is written once, like a
TP-replicated parameter: by TP rank 0 (param_meta.counted_once) and data-parallel replica 0 of
the pipeline stage holding the layer; any layout reads it whole. A checkpoint without it (saved
before the bias was checkpointed, or without the bias) loads into a run that has it with one
warning, the tensor keeping its initial value (0); a checkpoint holding it is refused by a run
that lacks it (the routing would change).
"""
from ...core.checkpointing import CheckpointError, make_piece
from ...core.tensor_parallel.param_meta import counted_once, data_parallel_replica
from ...core.transformer.model_state import non_trained_state
from ..observability.log import print_rank_0

BUFFER = "buffer"


def model_state_keys(model):
    """This rank's non-trained state keys (to all-gather with the parameter keys)."""
    return [key for key, _ in non_trained_state(model)]


def model_state_pieces(model, groups):
    """The checkpoint pieces this rank writes (whole tensors, at most one writer per tensor).
    groups: reads tp_rank, dp_rank, cp_rank; no communication."""
    return [make_piece(key, BUFFER, t, groups.tp_rank, groups.tp_size, 0, t.numel(), t)
            for key, t in non_trained_state(model)
            if counted_once(t, groups) and data_parallel_replica(t, groups)[0] == 0]


def missing_model_state(reader, every_rank_keys):
    """The keys of every_rank_keys (model_state_keys of all ranks) the checkpoint lacks; raises
    CheckpointError for a saved tensor no rank's model has."""
    wanted = {key for keys in every_rank_keys for key in keys}
    extra = set(reader.keys(BUFFER)) - wanted
    if extra:
        raise CheckpointError(f"checkpoint {reader.path} holds {sorted(extra)[0]!r} ({len(extra)} such) that this "
                              "model lacks: it was saved with --moe-router-enable-expert-bias or FP8 delayed scaling "
                              "(--fp8-format, --fp8-recipe delayed); add the flags it was saved with")
    return sorted(wanted - set(reader.keys(BUFFER)))


def load_model_state(reader, model, groups, missing):
    """Copy the checkpoint's tensors into this rank's non-trained state; those in `missing` (every
    rank's, from missing_model_state) keep their value, with one warning on rank 0."""
    for key, t in non_trained_state(model):
        if key not in missing:
            t.copy_(reader.shard(key, BUFFER, t, groups.tp_rank, groups.tp_size))
    if missing:
        print_rank_0(f"> warning: checkpoint {reader.path} has no {missing[0]!r} ({len(missing)} such: saved without "
                     "it, or before the MoE expert bias was checkpointed); it starts at 0")
