"""Layout-independent parameter initialisation.

Every parameter carries `init_key` (a name that does not depend on the layout), its
init rule, and, if TP-split, `partition_dim` / `partition_stride`. We draw the *full*
tensor from a generator seeded by (seed, init_key) and keep this rank's shard, so the
model's function is the same for every TP/PP/DP layout.
"""
import zlib

import torch


def set_tp_attrs(param, partition_dim, stride=1, unpadded_size=None):
    """Mark a parameter as split over TP along partition_dim (stride blocks split separately).

    unpadded_size: rows along partition_dim that hold real values; the rest (vocab
    padding) is initialised to zero.
    """
    param.tensor_model_parallel = True
    param.partition_dim = partition_dim
    param.partition_stride = stride
    param.unpadded_size = unpadded_size


def set_init(param, method, std=None):
    """method: 'normal' (std), 'zeros' or 'ones'."""
    param.init_method = method
    param.init_std = std


def take_shard(full, dim, stride, tp_rank, tp_size):
    """This rank's shard of a full tensor: each of `stride` blocks along dim split TP ways."""
    if tp_size == 1:
        return full
    blocks = full.chunk(stride, dim=dim)
    return torch.cat([b.chunk(tp_size, dim=dim)[tp_rank] for b in blocks], dim=dim)


def full_shape(param, tp_size):
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False):
        shape[param.partition_dim] *= tp_size
    return shape


@torch.no_grad()
def init_full_tensor(param, seed, tp_size):
    """The full (unsharded) initial value of `param` on its device, in fp32."""
    shape = full_shape(param, tp_size)
    method = getattr(param, "init_method", "normal")
    if method == "zeros":
        return torch.zeros(shape, device=param.device)
    if method == "ones":
        return torch.ones(shape, device=param.device)
    gen = torch.Generator(device=param.device)
    gen.manual_seed((seed * 1_000_003 + zlib.crc32(param.init_key.encode())) % (2 ** 63))
    real = list(shape)
    unpadded = getattr(param, "unpadded_size", None)
    if unpadded is not None:
        real[param.partition_dim] = unpadded
    value = torch.empty(real, device=param.device).normal_(0.0, param.init_std, generator=gen)
    if unpadded is not None and unpadded < shape[param.partition_dim]:
        pad = list(shape)
        pad[param.partition_dim] -= unpadded
        value = torch.cat([value, value.new_zeros(pad)], dim=param.partition_dim)
    return value


@torch.no_grad()
def initialize_parameters(model, seed, tp_rank, tp_size):
    """Fill every parameter of `model` from its layout-free full value. No communication."""
    for name, param in model.named_parameters():
        if not hasattr(param, "init_key"):
            raise RuntimeError(f"parameter {name} has no init_key")
        full = init_full_tensor(param, seed, tp_size)
        if getattr(param, "tensor_model_parallel", False):
            full = take_shard(full, param.partition_dim, param.partition_stride, tp_rank, tp_size)
        param.copy_(full)
