"""Per-aten-op launches, bytes moved and GEMM FLOPs of eager PyTorch code, counted on the CPU.

    with OpTraffic() as t:
        step()
    t.ops  # {"mm": OpCount(launches=..., read=..., written=..., flops=...), ...}: per aten op name

What counts as a GPU kernel and what it moves (the rules are meant to match eager CUDA):
- views and metadata (view, transpose, expand, detach, _unsafe_view, split, ...) and allocations
  (empty*) move nothing and launch nothing;
- every other op is one launch that reads each tensor argument once and writes each fresh
  output; an argument the op mutates (in-place ops, foreach lists) is read and written, an
  `out=` argument and the destination of copy_/fill_/zero_ are written only, *_like factories
  read nothing;
- a broadcast (stride-0) argument is read once, not once per use (a bias added to every row);
- indexing kernels touch only the indexed elements of their big operand (gather, index, embedding,
  index_put_, scatter_add_, index_add_, nll_loss: the target's logits);
- multi-tensor ops (_foreach_*, _fused_adam*) launch as CUDA's multi_tensor_apply batches them
  (tensors and 64 Ki-element chunks per launch by list depth); _foreach_norm adds a cleanup launch;
- ops on zero elements launch nothing; .item() (_local_scalar_dense) counts as a launch (a sync);
- FLOPs: matrix products (torch.utils.flop_counter's formulas; MoE's _grouped_mm: 2 N K M over its
  N rows; megatron::wgrad_accumulate's GEMM) and attention, 4 B H Sq Sk D forward and twice that
  backward (causal masking not subtracted, as MFU counts them).
Byte counts are the minimum an ideal kernel of each op moves (GEMM operands read once), so
equal GEMMs cancel in a difference and what remains is elementwise and reduction traffic.
"""
import dataclasses
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

NO_KERNEL = {aten._unsafe_view, aten.detach, aten.alias, aten.lift_fresh, aten.empty, aten.empty_like,
             aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten._reshape_alias, aten.resize_,
             aten.set_, aten.sym_size, aten.sym_stride, aten.sym_numel, aten.is_same_size, aten.dim,
             aten.is_nonzero, aten._has_compatible_shallow_copy_type, aten.record_stream}
NO_READ = {aten.zeros_like, aten.ones_like, aten.full_like, aten.empty_like, aten.rand_like, aten.randn_like,
           aten.new_zeros, aten.new_ones, aten.new_full}  # take only the argument's shape
WRITE_ONLY_SELF = {aten.copy_, aten.fill_, aten.zero_, aten.normal_, aten.uniform_, aten.random_, aten.bernoulli_,
                   aten.exponential_, aten._foreach_copy_, aten._foreach_zero_, aten.index_copy_, aten.scatter_}
# indexing kernels touch only the indexed elements of their big operand: gathers read what they output,
# in-place scatters touch what their source holds (index_put_: its index positions)
GATHERS = {aten.index: "self", aten.gather: "self", aten.index_select: "self", aten.take: "self",
           aten.embedding: "weight"}
SCATTERS = {aten.scatter_add_: "src", aten.index_add_: "source", aten.index_copy_: "source", aten.scatter_: "src"}
ATTENTION_FWD = {aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention,
                 aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention}
ATTENTION_BWD = {aten._scaled_dot_product_flash_attention_for_cpu_backward,
                 aten._scaled_dot_product_flash_attention_backward,
                 aten._scaled_dot_product_efficient_attention_backward,
                 aten._scaled_dot_product_cudnn_attention_backward}
# multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): tensors per launch by list depth, 320
# blocks of 64 Ki elements per launch
_MTA_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_MTA_BLOCKS, _MTA_CHUNK = 320, 65536


@dataclasses.dataclass
class OpCount:
    launches: int = 0
    read: int = 0       # bytes
    written: int = 0    # bytes
    flops: int = 0

    @property
    def bytes(self):
        return self.read + self.written

    def add(self, other):
        self.launches += other.launches
        self.read += other.read
        self.written += other.written
        self.flops += other.flops


def touched_bytes(t):
    """Bytes of the distinct elements of `t` (a broadcast dimension, stride 0, counts once)."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return 0
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _tensors(value):
    return [x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)]


def multi_tensor_launches(numels, depth):
    """Launches of CUDA's multi_tensor_apply over tensors of `numels` elements and `depth` lists."""
    max_tensors = _MTA_TENSORS[min(max(depth, 1), 5)]
    numels = [n for n in numels if n]
    launches, tensors, blocks = 0, 0, 0
    for i, n in enumerate(numels):
        tensors += 1
        chunks = -(-n // _MTA_CHUNK)
        for c in range(chunks):
            blocks += 1
            last = c == chunks - 1
            if (tensors == max_tensors and last) or blocks == _MTA_BLOCKS or (last and i == len(numels) - 1):
                launches += 1
                blocks, tensors = 0, (0 if last else 1)  # a tensor cut mid-way goes on in the next launch
    return launches


def attention_flops(func, args):
    q, k = args[0], args[1]
    *batch, sq, d = q.shape
    fwd = 4 * sq * k.shape[-2] * d
    for n in batch:
        fwd *= n
    return fwd if func.overloadpacket in ATTENTION_FWD else 2 * fwd


def indexed_bytes(packet, arg, named, out):
    """Bytes an indexing kernel touches of operand `arg` (named: the call's arguments by name), or None
    where the generic rule (the whole tensor) holds."""
    if GATHERS.get(packet) == arg:
        return touched_bytes(out)
    self = named.get("self")
    if arg != "self" or not isinstance(self, torch.Tensor):
        return None
    if packet in SCATTERS:
        src = named.get(SCATTERS[packet])
        return touched_bytes(src) if isinstance(src, torch.Tensor) else named["index"].numel() * self.element_size()
    if packet is aten.index_put_:
        indices = named["indices"]
        rows = max(t.numel() for t in indices if t is not None)
        return rows * math.prod(self.shape[len(indices):]) * self.element_size()
    if packet in (aten.nll_loss_forward, aten.nll_loss2d_forward):  # the target's logits only
        return named["target"].numel() * self.element_size()
    if packet in (aten.nll_loss_backward, aten.nll_loss2d_backward):  # self gives the shape only
        return 0
    return None


def count_op(func, args, kwargs, out):
    """OpCount of one call of aten op `func` (None: a view, metadata op or allocation)."""
    packet = func.overloadpacket
    if packet in NO_KERNEL or func.is_view:
        return None
    name = packet.__name__
    multi = name.startswith("_foreach_") or name.startswith("_fused_")
    c = OpCount()
    lists = []  # the multi-tensor op's lists of per-parameter tensors
    schema_args = func._schema.arguments
    named = {a.name: args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(schema_args)}
    for i, arg in enumerate(schema_args):
        value = named[arg.name]
        tensors = _tensors(value)
        if not tensors:
            continue
        size = indexed_bytes(packet, arg.name, named, out)
        size = sum(touched_bytes(t) for t in tensors) if size is None else size
        # fused Adam marks its grads mutable for the unscale it does only with a grad_scale
        write = arg.alias_info is not None and arg.alias_info.is_write and not (
            name.startswith("_fused_adam") and arg.name == "grads" and kwargs.get("grad_scale") is None)
        if packet in NO_READ and i == 0:
            continue
        if write:
            c.written += size
            write_only = (i == 0 and (packet in WRITE_ONLY_SELF or (packet is aten.index_put_ and
                                                                    not named.get("accumulate"))))
            # megatron::wgrad_accumulate with accumulate=False writes its product (beta 0): main not read
            write_only = write_only or (name == "wgrad_accumulate" and named.get("accumulate") is False)
            if arg.name != "out" and not write_only:
                c.read += size
        else:
            c.read += size
        if multi and isinstance(value, (list, tuple)) and tensors[0].numel() == (lists[0][0].numel() if lists else
                                                                               tensors[0].numel()):
            lists.append(tensors)
    for ret, value in zip(func._schema.returns, out if len(func._schema.returns) > 1 else (out,)):
        if ret.alias_info is None:
            size = sum(touched_bytes(t) for t in _tensors(value))
            c.written += size
            if multi and isinstance(value, (list, tuple)) and size:
                lists.append(_tensors(value))
    if c.read == 0 and c.written == 0 and packet is not aten._local_scalar_dense:
        return None  # zero elements: no kernel
    if multi and lists:
        c.launches = multi_tensor_launches([t.numel() for t in lists[0]], len(lists)) + (name == "_foreach_norm")
    else:
        c.launches = 1
    if name == "_grouped_mm" and args[0].dim() == 2 and args[1].dim() == 3:  # rows of a [N, K] x groups of [K, M]
        c.flops = 2 * args[0].shape[0] * args[0].shape[1] * args[1].shape[2]
    elif name == "wgrad_accumulate":  # megatron::wgrad_accumulate(x, g, main!): main += g^T x, one GEMM
        c.flops = 2 * named["x"].numel() * named["g"].shape[-1]
    elif packet in flop_registry:
        c.flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
    elif packet in ATTENTION_FWD or packet in ATTENTION_BWD:
        c.flops = attention_flops(func, args)
    return c


class OpTraffic(TorchDispatchMode):
    """Counts, per aten op name, the launches, bytes and FLOPs of everything run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace in ("prim", "profiler"):  # tensor.device on fake tensors, record_function: no kernel
            return out
        c = count_op(func, args, kwargs, out)
        if c is not None:
            self.ops.setdefault(str(func.overloadpacket.__name__), OpCount()).add(c)
        return out

    def total(self):
        t = OpCount()
        for c in self.ops.values():
            t.add(c)
        return t
