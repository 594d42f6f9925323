"""Column-, row- and vocab-parallel layers over the TP group.

Activations are [s, b, h]. With sequence_parallel=True the activations entering a
column-parallel layer and leaving a row-parallel layer are split along s ([s/TP, b, h]).
Linear layers return (output, bias) like Megatron-LM: bias is None unless
skip_bias_add=True, in which case the caller adds it (so it can be fused).
"""
import torch
import torch.nn.functional as F
from torch import nn

from .. import comm
from ..backward_needs import needs_grad
from ..fp8.linear import fp8_linear
from ..fp8.recipes import build_recipe
from .mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from .param_meta import set_init, set_sequence_parallel, set_tensor_parallel


class _SequenceParallelLinear(torch.autograd.Function):
    """y = all_gather_s(x) W^T + b that keeps only this rank's shard x for the backward.

    Sequence parallelism's memory saving is that activations outside TP regions hold s/TP
    tokens; gathering and then calling F.linear would keep the gathered [s, b, in] for the
    weight gradient instead. As Megatron-LM does, we keep the shard and gather it again
    in the backward: one more all-gather per layer, for 1/TP of the input's memory. Each part of
    the backward runs only where the running backward uses it (backward_needs.py): under a
    zero-bubble split the reduce-scatter is in B, the all-gather and the weight GEMM in W.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.has_bias = group, bias is not None
        return F.linear(comm.all_gather_dim0(x, group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if needs_grad(ctx, 0):
            grad_x = comm.reduce_scatter_dim0(grad.matmul(weight), ctx.group)  # partial sums over TP
        if needs_grad(ctx, 1):
            grad_weight = g.t().mm(comm.all_gather_dim0(x, ctx.group).reshape(-1, x.shape[-1]))
        if ctx.has_bias and needs_grad(ctx, 2):
            grad_bias = g.sum(0)
        return grad_x, grad_weight, grad_bias, None


def _fp8_recipe(fp8, group, cp_group):
    """The FP8 recipe module of a TP linear (None without FP8). An activation or output gradient is split
    over TP (shards of features, or of the sequence with SP) and CP (chunks of the sequence): its amax is
    the MAX over both groups; a weight is split over TP only. A replicated piece reduces to itself."""
    return None if fp8 is None else build_recipe(fp8, (group, cp_group), (group,))


def _divide(n, d, what):
    if n % d:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size ({d})")
    return n // d


class ColumnParallelLinear(nn.Module):
    """Y = X A^T + b with A [out, in] split along out: this rank holds [out/TP, in].

    Input [s, b, in] (or [s/TP, b, in] with sequence_parallel); output [s, b, out/TP],
    or [s, b, out] with gather_output. Talks to the TP group `group`.
    stride: A is `stride` blocks along out, each split separately (SwiGLU's [gate; up]).
    fp8: the FP8 settings (core/fp8/config.py) to run the GEMMs in FP8, or None; cp_group: the CP group
    (None at CP 1), over which FP8 amaxes of the sequence's chunks are reduced.
    """

    def __init__(self, input_size, output_size, *, group, bias=True, gather_output=False,
                 init_std=0.02, stride=1, sequence_parallel=False, skip_bias_add=False,
                 params_dtype=torch.float32, device=None, fp8=None, cp_group=None):
        super().__init__()
        self.fp8 = _fp8_recipe(fp8, group, cp_group)
        self.group, self.tp = group, comm.world(group)
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        self.skip_bias_add = skip_bias_add
        if gather_output and sequence_parallel:
            raise ValueError("gather_output is not supported with sequence_parallel")
        out = _divide(output_size, self.tp, "output size")
        self.weight = nn.Parameter(torch.empty(out, input_size, dtype=params_dtype, device=device))
        set_tensor_parallel(self.weight, 0, stride)
        set_init(self.weight, "normal", init_std)
        if bias:
            self.bias = nn.Parameter(torch.empty(out, dtype=params_dtype, device=device))
            set_tensor_parallel(self.bias, 0, stride)
            set_init(self.bias, "zeros")
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        bias = None if self.skip_bias_add else self.bias
        if self.fp8 is not None:  # the gathered input is kept in FP8 for the backward
            gather = self.sequence_parallel and self.tp > 1
            x = gather_from_sequence_parallel_region(x, self.group) if gather \
                else copy_to_tensor_model_parallel_region(x, self.group)
            y = fp8_linear(x, self.weight, bias, self.fp8)
        elif self.sequence_parallel and self.tp > 1:
            y = _SequenceParallelLinear.apply(x, self.weight, bias, self.group)
        else:
            y = F.linear(copy_to_tensor_model_parallel_region(x, self.group), self.weight, bias)
        if self.gather_output:
            y = gather_from_tensor_model_parallel_region(y, self.group)
        return y, (self.bias if self.skip_bias_add else None)


class RowParallelLinear(nn.Module):
    """Y = X A^T + b with A [out, in] split along in: this rank holds [out, in/TP].

    Input [s, b, in/TP] (input_is_parallel) or [s, b, in]; output [s, b, out] summed
    over the TP group, or reduce-scattered to [s/TP, b, out] with sequence_parallel.
    The bias is replicated and added after the reduction. fp8, cp_group: as ColumnParallelLinear's.
    """

    def __init__(self, input_size, output_size, *, group, bias=True, input_is_parallel=True,
                 init_std=0.02, sequence_parallel=False, skip_bias_add=False,
                 params_dtype=torch.float32, device=None, fp8=None, cp_group=None):
        super().__init__()
        self.fp8 = _fp8_recipe(fp8, group, cp_group)
        self.group, self.tp = group, comm.world(group)
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.skip_bias_add = skip_bias_add
        if sequence_parallel and not input_is_parallel:
            raise ValueError("sequence_parallel needs input_is_parallel=True")
        inp = _divide(input_size, self.tp, "input size")
        self.weight = nn.Parameter(torch.empty(output_size, inp, dtype=params_dtype, device=device))
        set_tensor_parallel(self.weight, 1)
        set_init(self.weight, "normal", init_std)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=params_dtype, device=device))
            set_init(self.bias, "zeros")
            # each rank adds the bias to its own sequence shard: its grad is partial
            set_sequence_parallel(self.bias, sequence_parallel)
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x, self.group)
        y = F.linear(x, self.weight) if self.fp8 is None else fp8_linear(x, self.weight, None, self.fp8)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(y, self.group)
        else:
            y = reduce_from_tensor_model_parallel_region(y, self.group)
        if self.skip_bias_add:
            return y, self.bias
        return (y + self.bias if self.bias is not None else y), None


class VocabParallelEmbedding(nn.Module):
    """Embedding table [V_padded, h] split along the vocabulary over the TP group.

    Input token ids [s, b]; output [s, b, h] summed over TP (each id lives on one rank),
    or reduce-scattered to [s/TP, b, h] with reduce_scatter_embeddings (sequence parallel).
    Rows at or beyond `unpadded_vocab_size` are padding: zero and never looked up.
    """

    def __init__(self, padded_vocab_size, hidden_size, *, group, unpadded_vocab_size,
                 init_std=0.02, reduce_scatter_embeddings=False,
                 params_dtype=torch.float32, device=None):
        super().__init__()
        self.group, self.tp = group, comm.world(group)
        self.reduce_scatter_embeddings = reduce_scatter_embeddings
        per_rank = _divide(padded_vocab_size, self.tp, "padded vocabulary size")
        self.vocab_start = per_rank * comm.rank(group)
        self.vocab_end = self.vocab_start + per_rank
        self.weight = nn.Parameter(torch.empty(per_rank, hidden_size, dtype=params_dtype, device=device))
        set_tensor_parallel(self.weight, 0, unpadded_size=unpadded_vocab_size)
        set_init(self.weight, "normal", init_std)

    def forward(self, ids):
        if self.tp > 1:
            outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
            local = (ids - self.vocab_start).masked_fill(outside, 0)
            out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        else:
            out = F.embedding(ids, self.weight)
        if self.reduce_scatter_embeddings:
            return reduce_scatter_to_sequence_parallel_region(out, self.group)
        return reduce_from_tensor_model_parallel_region(out, self.group)
