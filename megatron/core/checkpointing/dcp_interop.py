"""Our global tensors as a standard torch.distributed.checkpoint (DCP) checkpoint, and back
(tools/checkpoint/convert.py --saver torch_dcp / --loader torch_dcp).

The DCP state dict is flat: {init_key: global unpadded tensor} for every parameter, plus
ARGS_KEY: the saved arguments ({"model": ..., "training": ...}) as a JSON string (DCP stores
it as bytes). Any DCP reader loads it with torch alone: read the metadata, make a tensor of
each entry's size and dtype, dcp.load. Written and read by one process (no process group:
DCP then runs without collectives); Adam's moments are not carried (a converted checkpoint
trains from fresh optimizer state, as the HF conversions do).

The model's non-trained state (state "buffer" of ours: the MoE routers' expert bias) sits in the
same flat dict under its own keys (e.g. decoder.layers.0.mlp.router.expert_bias, also its name in
our model's state_dict), listed in the arguments' "buffer_keys".
"""
import json
import os
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from .pieces import CheckpointError

ARGS_KEY = "megatron_args"
BUFFER_KEYS = "buffer_keys"


def save_dcp(path, tensors, args, buffers=None):
    """Write {key: tensor} (the parameters), {key: tensor} buffers (non-trained state) and the
    argument dict `args` to directory `path` as a DCP checkpoint."""
    os.makedirs(path, exist_ok=True)
    state = {k: v.contiguous() for k, v in {**tensors, **(buffers or {})}.items()}
    state[ARGS_KEY] = json.dumps(dict(args, **{BUFFER_KEYS: sorted(buffers)}) if buffers else args)
    with warnings.catch_warnings():  # "no process group: running single-process" is the intent
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path))


def load_dcp(path):
    """-> (args dict, {key: tensor}) of a DCP checkpoint directory written by save_dcp, or any
    DCP checkpoint of plain tensors (args then {} unless it holds ARGS_KEY)."""
    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise CheckpointError(f"--load-dir {path}: not a torch.distributed.checkpoint directory (no .metadata)")
    reader = dcp.FileSystemReader(path)
    entries = reader.read_metadata().state_dict_metadata
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in entries.items()
             if isinstance(m, TensorStorageMetadata)}
    if ARGS_KEY in entries:
        state[ARGS_KEY] = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader)
    args = json.loads(state.pop(ARGS_KEY)) if ARGS_KEY in state else {}
    return args, state


def split_buffers(args, tensors):
    """(args, {key: tensor}) of load_dcp -> ({key: parameter}, {key: buffer}) by args' "buffer_keys"."""
    names = set(args.get(BUFFER_KEYS, ()))
    missing = names - set(tensors)
    if missing:
        raise CheckpointError(f"DCP checkpoint lists buffer {sorted(missing)[0]!r} but holds no such tensor")
    return ({k: v for k, v in tensors.items() if k not in names}, {k: v for k, v in tensors.items() if k in names})
