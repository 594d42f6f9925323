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
from ..fp8.linear import fp8_linear
from ..fp8.recipes import build_recipe
from ..parallel_layout import sequence_split
from . import wgrad_fusion
from .mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from .param_meta import set_init, set_sequence_parallel, set_tensor_parallel


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

    def fp8_weights(self):
        """[(weight, its FP8 recipe)] of the GEMMs run in FP8 here (core/fp8/weights.py)."""
        return [] if self.fp8 is None else [(self.weight, self.fp8)]

    def forward(self, x):
        bias = None if self.skip_bias_add else self.bias
        sp = sequence_split(self.sequence_parallel, self.tp)
        if self.fp8 is not None:  # the gathered input is kept in FP8 for the backward
            x = gather_from_sequence_parallel_region(x, self.group) if sp \
                else copy_to_tensor_model_parallel_region(x, self.group)
            y = fp8_linear(x, self.weight, bias, self.fp8)
        elif sp or wgrad_fusion.fusable(self.weight):
            # sequence parallelism: as Megatron-LM, the shard [s/TP, b, in] is kept for the weight gradient
            # and gathered again in the backward (one more all-gather per layer for 1/TP of the input's
            # memory); gradient-accumulation fusion: the weight gradient added into DDP's buffer
            x = x if sp else copy_to_tensor_model_parallel_region(x, self.group)
            y = wgrad_fusion.linear(x, self.weight, bias, self.group if sp else None)
        else:
            y = F.linear(copy_to_tensor_model_parallel_region(x, self.group), self.weight, bias)
        if self.gather_output:
            y = gather_from_tensor_model_parallel_region(y, self.group)
        return y, (self.bias if self.skip_bias_add else None)


class RowParallelLinear(nn.Module):
    """Y = X A^T + b with A [out, in] split along in: this rank holds [out, in/TP].

    Input [s, b, in/TP] (input_is_parallel) or [s, b, in]; output [s, b, out] summed
    over the TP group, or reduce-scattered to [s/TP, b, out] with sequence_parallel.
    The bias is replicated; TP rank 0 adds it inside its GEMM (addmm), before the sum over TP, which
    thus adds it once: no pass of its own over the output. Every rank's copy still gets its gradient:
    the sum over all tokens of the output's gradient on each rank, or with sequence_parallel on rank 0
    alone (zero elsewhere; finalize_model_grads sums it over TP, as for any sequence-parallel bias).
    fp8, cp_group: as ColumnParallelLinear's.
    """

    def __init__(self, input_size, output_size, *, group, bias=True, input_is_parallel=True,
                 init_std=0.02, sequence_parallel=False, skip_bias_add=False,
                 params_dtype=torch.float32, device=None, fp8=None, cp_group=None):
        super().__init__()
        self.fp8 = _fp8_recipe(fp8, group, cp_group)
        self.group, self.tp = group, comm.world(group)
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.skip_bias_add = skip_bias_add
        self.adds_bias = comm.rank(group) == 0  # the TP rank whose GEMM adds the bias
        if sequence_parallel and not input_is_parallel:
            raise ValueError("sequence_parallel needs input_is_parallel=True")
        inp = _divide(input_size, self.tp, "input size")
        self.weight = nn.Parameter(torch.empty(output_size, inp, dtype=params_dtype, device=device))
        set_tensor_parallel(self.weight, 1)
        set_init(self.weight, "normal", init_std)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=params_dtype, device=device))
            set_init(self.bias, "zeros")
            # with sequence parallelism its gradient is partial on each rank (see forward): summed over TP
            set_sequence_parallel(self.bias, sequence_parallel)
        else:
            self.register_parameter("bias", None)

    def fp8_weights(self):
        """[(weight, its FP8 recipe)] of the GEMMs run in FP8 here (core/fp8/weights.py)."""
        return [] if self.fp8 is None else [(self.weight, self.fp8)]

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x, self.group)
        inside = self.bias is not None and not self.skip_bias_add
        bias = self.bias if inside and self.adds_bias else None
        if self.fp8 is not None:
            y = fp8_linear(x, self.weight, bias, self.fp8)
        else:
            y = (wgrad_fusion.linear if wgrad_fusion.fusable(self.weight) else F.linear)(x, self.weight, bias)
        if inside and not self.adds_bias:
            y = wgrad_fusion.bias_grad_only(y, self.bias, counted=not self.sequence_parallel)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(y, self.group)
        else:
            y = reduce_from_tensor_model_parallel_region(y, self.group)
        if self.skip_bias_add:
            return y, self.bias
        return y, None


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
