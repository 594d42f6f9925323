"""Layout-free tensor pieces: what a rank writes, and how any rank gets its shard back.

A checkpoint stores every tensor as its GLOBAL value (unsharded, vocabulary padding
removed), keyed by (init_key, state) with state in {"param", "exp_avg", "exp_avg_sq"}.
A rank writes the part it owns as a *piece* (a plain dict, so torch.load(weights_only)
reads it):

    key, state      which global tensor
    shape           its global, unpadded shape (e.g. [vocab, h])
    dim, stride     TP split (None when the tensor is not split) and the number of blocks
                    split separately (SwiGLU fc1 [gate; up]: 2) -- the rule of `take_shard`
    padded          global size along dim including the saving layout's vocab padding
    tp_rank, tp_size
    lo, hi          flat range [lo, hi) of that TP shard (a distributed-optimizer slice;
                    the whole shard otherwise)
    data            1-D tensor of hi - lo values

So a piece's placement is the same sharding rule the model uses (`take_shard` followed
by a flat range), not a list of boxes: a DP-sharded flat range of a row-parallel shard is
not a rectangle of the global tensor, and this way it needs no special case. Reading
assembles the global tensor from its pieces (checking every element is covered) and
cuts the loading rank's shard with the same rule under the loading layout.
"""
import torch

from ..errors import CheckpointError
from ..tensor_parallel.initialization import take_shard
from ..tensor_parallel.param_meta import param_meta


def param_rule(param, tp_rank, tp_size):
    """(global unpadded shape, dim, stride, padded size along dim) of a model parameter."""
    shape, meta = list(param.shape), param_meta(param)
    if not meta.tensor_parallel:
        return shape, None, 1, None
    dim = meta.partition_dim
    padded = shape[dim] * tp_size
    shape[dim] = meta.unpadded_size if meta.unpadded_size is not None else padded
    return shape, dim, meta.partition_stride, padded


def make_piece(key, state, param, tp_rank, tp_size, lo, hi, data):
    """A piece of the global tensor `key`/`state`: `data` is flat range [lo, hi) of this
    rank's TP shard of `param` (cloned: a view would make torch.save write its whole storage)."""
    shape, dim, stride, padded = param_rule(param, tp_rank, tp_size)
    return {"key": key, "state": state, "shape": shape, "dim": dim, "stride": stride,
            "padded": padded, "tp_rank": tp_rank, "tp_size": tp_size, "lo": lo, "hi": hi,
            "data": data.detach().reshape(-1).clone().cpu()}


def whole_piece(key, state, tensor):
    """A piece holding a whole global tensor (converters, single-process writers)."""
    return {"key": key, "state": state, "shape": list(tensor.shape), "dim": None, "stride": 1,
            "padded": None, "tp_rank": 0, "tp_size": 1, "lo": 0, "hi": tensor.numel(),
            "data": tensor.detach().reshape(-1).clone().cpu()}


def _padded_shape(piece):
    shape = list(piece["shape"])
    if piece["dim"] is not None:
        shape[piece["dim"]] = piece["padded"]
    return shape


def _place(full, piece, values):
    """Write `values` (flat, hi - lo) into the elements of `full` [padded shape] the piece covers.

    Read-modify-write through this rank's shard: elements of the shard outside [lo, hi)
    are written back unchanged.
    """
    dim, lo, hi = piece["dim"], piece["lo"], piece["hi"]
    if dim is None:
        full.view(-1)[lo:hi] = values
        return
    stride, r, n = piece["stride"], piece["tp_rank"], piece["tp_size"]
    shard = take_shard(full, dim, stride, r, n).clone()
    shard.view(-1)[lo:hi] = values
    views = [b.chunk(n, dim=dim)[r] for b in full.chunk(stride, dim=dim)]  # views of full
    size = views[0].shape[dim]
    for i, v in enumerate(views):
        v.copy_(shard.narrow(dim, i * size, size))


def assemble(pieces, what):
    """The global (unpadded) tensor from all its pieces; raises CheckpointError if the
    pieces disagree on the shape or leave any element uncovered. what: name for messages."""
    shape = pieces[0]["shape"]
    full = None
    for p in pieces:
        if p["shape"] != shape:
            raise CheckpointError(f"checkpoint is inconsistent: {what} has pieces of global shape "
                                  f"{shape} and {p['shape']}")
        # pieces may come from layouts with different padding: place each in its own padded
        # frame, then crop to the real rows
        frame = torch.zeros(_padded_shape(p), dtype=p["data"].dtype)
        mask = torch.zeros(_padded_shape(p), dtype=torch.bool)
        _place(frame, p, p["data"])
        _place(mask, p, torch.ones(p["hi"] - p["lo"], dtype=torch.bool))
        if p["dim"] is not None:
            frame = frame.narrow(p["dim"], 0, shape[p["dim"]])
            mask = mask.narrow(p["dim"], 0, shape[p["dim"]])
        if full is None:
            full = torch.zeros(shape, dtype=frame.dtype)
            covered = torch.zeros(shape, dtype=torch.bool)
        full[mask] = frame[mask]
        covered |= mask
    if not bool(covered.all()):
        missing = int((~covered).sum())
        raise CheckpointError(f"checkpoint is incomplete: {missing} of {covered.numel()} elements "
                              f"of {what} are in no shard file")
    return full


def check_shape(saved, expected, key):
    """CheckpointError unless the saved global shape of tensor `key` is the model's."""
    if list(saved) != list(expected):
        raise CheckpointError(f"checkpoint tensor {key!r} has shape {list(saved)}, "
                              f"the model expects {list(expected)} (was it saved with other model flags?)")


def local_shard(global_tensor, param, tp_rank, tp_size):
    """This rank's TP shard of a global tensor for `param`, padded to the loading layout."""
    shape, dim, stride, padded = param_rule(param, tp_rank, tp_size)
    check_shape(list(global_tensor.shape), shape, param_meta(param).init_key)
    if dim is None:
        return global_tensor
    if padded > shape[dim]:
        pad = list(shape)
        pad[dim] = padded - shape[dim]
        global_tensor = torch.cat([global_tensor, global_tensor.new_zeros(pad)], dim=dim)
    return take_shard(global_tensor, dim, stride, tp_rank, tp_size)
