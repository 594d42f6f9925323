"""Layout-independent parameter initialisation.

Every parameter's ParamMeta (param_meta.py) holds `init_key` (a name that does not depend
on the layout), its init rule, and, if TP-split, `partition_dim` / `partition_stride`. We draw the *full*
tensor from a generator seeded by (seed, init_key) and keep this rank's shard, so the
model's function is the same for every TP/PP/DP layout.
"""
import zlib

import torch

from .param_meta import param_meta


def take_shard(full, dim, stride, tp_rank, tp_size):
    """This rank's shard of a full tensor: each of `stride` blocks along dim split TP ways."""
    if tp_size == 1:
        return full
    blocks = full.chunk(stride, dim=dim)
    return torch.cat([b.chunk(tp_size, dim=dim)[tp_rank] for b in blocks], dim=dim)


def full_shape(param, tp_size):
    shape, meta = list(param.shape), param_meta(param)
    if meta.tensor_parallel:
        shape[meta.partition_dim] *= tp_size
    return shape


@torch.no_grad()
def init_full_tensor(param, seed, tp_size):
    """The full (unsharded) initial value of `param` on its device, in fp32."""
    shape, meta = full_shape(param, tp_size), param_meta(param)
    method = meta.init_method
    if method == "zeros":
        return torch.zeros(shape, device=param.device)
    if method == "ones":
        return torch.ones(shape, device=param.device)
    gen = torch.Generator(device=param.device)
    gen.manual_seed((seed * 1_000_003 + zlib.crc32(meta.init_key.encode())) % (2 ** 63))
    real = list(shape)
    unpadded, dim = meta.unpadded_size, meta.partition_dim
    if unpadded is not None:
        real[dim] = unpadded
    value = torch.empty(real, device=param.device).normal_(0.0, meta.init_std, generator=gen)
    if unpadded is not None and unpadded < shape[dim]:
        pad = list(shape)
        pad[dim] -= unpadded
        value = torch.cat([value, value.new_zeros(pad)], dim=dim)
    return value


@torch.no_grad()
def initialize_parameters(model, seed, tp_rank, tp_size, expert_tp=None):
    """Fill every parameter of `model` from its layout-free full value. No communication.
    expert_tp: (rank, size) of the expert-TP split for experts' parameters (default: tp_rank, tp_size)."""
    for name, param in model.named_parameters():
        meta = param_meta(param)
        if meta.init_key is None:
            raise RuntimeError(f"parameter {name} has no init_key")
        rank, size = expert_tp if expert_tp is not None and meta.expert_parallel else (tp_rank, tp_size)
        full = init_full_tensor(param, seed, size)
        if meta.tensor_parallel:
            full = take_shard(full, meta.partition_dim, meta.partition_stride, rank, size)
        param.copy_(full)
