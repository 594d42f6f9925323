"""--moe-grouped-gemm: the local experts' matmuls as one grouped matmul per projection.

torch._grouped_mm where this torch has it and the shapes suit it (rows of 16-byte multiples), else a
loop of matmuls: the same products, summed in an order that may differ in the last bits. Its group offsets
are a device tensor (token_counts.TokenCounts), so the grouped path reads nothing on the host; the loop reads the sizes
once. The backward is written here (torch's own fails on CPU): the input gradient grouped, and every
expert's weight gradient g_e^T x_e as one grouped matmul of two 2D operands (the row blocks are the
contracted dimension), [G, out, in], the parameters' own layout, so each expert's gradient is a
contiguous view that autograd takes as it is; a loop where torch refuses that form. Each part runs
only where the running backward uses it (backward_needs.py: a zero-bubble B the input's, W the weights').
With gradient-accumulation fusion each expert's gradient goes into its grad sink (wgrad_fusion.deposit).
"""
import functools

import torch
import torch.nn.functional as F

from ...backward_needs import needs_grad
from ...tensor_parallel import wgrad_fusion
from .token_counts import TokenCounts

_HAS_GROUPED = hasattr(torch, "_grouped_mm")


def _suits(x, w):
    """Whether torch._grouped_mm takes x [N, in] with weights w [G, out, in] of its dtype, in each of
    the three products (CUDA kernels take bf16 only, Hopper and later; the CPU one fp32 too; TMA wants
    rows of 16-byte multiples). Checked once per forward (host Python is the cost at small shapes)."""
    dtypes = (torch.float32, torch.bfloat16) if x.device.type == "cpu" else (torch.bfloat16,)
    size = x.element_size()
    return (_HAS_GROUPED and x.dtype in dtypes and x.dtype == w.dtype
            and (x.shape[1] * size) % 16 == 0 and (w.shape[1] * size) % 16 == 0)


def _mm(x, w, counts, grouped=True):
    """[N, K] x [G, K, M] with counts (TokenCounts) rows for each group -> [N, M]; grouped: _suits."""
    if grouped:
        try:
            return torch._grouped_mm(x, w, offs=counts.offsets())
        except RuntimeError:  # a GPU or layout this torch's kernel refuses: the loop computes the same products
            pass
    outs = [chunk @ w[g] for g, chunk in enumerate(x.split(counts.sizes()))]
    return torch.cat(outs) if outs else x.new_zeros(0, w.shape[2])


@functools.cache
def _empty_groups_written(device):
    """Whether torch._grouped_mm leaves a zero-row group's [out, in] block at zero in the 2D x 2D form:
    on CPU (a loop of mm) and on Hopper; Blackwell's kernel was seen writing garbage there
    (pytorch/pytorch#172439), so elsewhere those blocks are zeroed after it."""
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9)


def weight_grads(x, g, counts, grouped=True):
    """[G, out, in]: g_e^T x_e for the row blocks of x [N, in] and g [N, out] (an expert without rows: 0);
    grouped: _suits (the same check as the forward's)."""
    if x.shape[0] == 0:
        return x.new_zeros(len(counts), g.shape[1], x.shape[1])
    if grouped:
        try:
            dw = torch._grouped_mm(g.t(), x, offs=counts.offsets())
        except RuntimeError:  # this torch has no 2D x 2D form (or refuses the layout): the loop
            dw = None
        if dw is not None:
            if not _empty_groups_written(x.device):
                dw = torch.where((counts.counts() > 0)[:, None, None], dw, 0)
            return dw
    sizes = counts.sizes()
    return torch.stack([gi.t() @ xi for xi, gi in zip(x.split(sizes), g.split(sizes))])


class _GroupedLinear(torch.autograd.Function):
    """x [N, in] sorted by group -> [N, out], row block g through weights[g] [out, in]; the last argument
    is the TokenCounts (after the tensors: backward_needs indexes the tensor inputs' edges)."""

    @staticmethod
    def forward(ctx, x, *weights_and_counts):
        *weights, counts = weights_and_counts
        w = torch.stack(weights)  # [G, out, in]
        ctx.save_for_backward(x, w)
        ctx.counts, ctx.grouped, ctx.weights = counts, _suits(x, w), weights
        return _mm(x, w.transpose(1, 2), counts, ctx.grouped)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        counts, grouped, g = ctx.counts, ctx.grouped, g.contiguous()
        dx = _mm(g, w, counts, grouped) if needs_grad(ctx, 0) else None
        wanted = [needs_grad(ctx, 1 + i) for i in range(len(counts))]
        dw = weight_grads(x, g, counts, grouped).unbind(0) if any(wanted) else wanted
        dw = [wgrad_fusion.deposit(p, d) if want else None for p, d, want in zip(ctx.weights, dw, wanted)]
        return (dx, *dw, None)


def _counts(counts, device):
    return counts if isinstance(counts, TokenCounts) else TokenCounts.of(counts, device)


def grouped_linear(x, weights, biases, counts):
    """x [N, in] sorted by group (counts: TokenCounts, or a list of ints) -> [N, out], row block g
    through weights[g] [out, in] (+ biases[g] [out], or all None): one grouped matmul. No communication."""
    counts = _counts(counts, x.device)
    y = _GroupedLinear.apply(x, *weights, counts)
    return y if biases[0] is None else y + per_row(torch.stack(biases), counts, x.shape[0])


def grouped_mm(x, w, counts):
    """Differentiable grouped matmul: rows of x split by counts (TokenCounts or list of ints), group g
    times w[g] ([G, K, M])."""
    return grouped_linear(x, list(w.transpose(1, 2).unbind(0)), [None], counts)


def grouped_experts(experts, x, counts, fc2_bias=True):
    """The ExpertMLPs `experts` on x [N, h] sorted by expert (counts: TokenCounts) -> [N, h], as two
    grouped matmuls (fc1, fc2) with the activation between. Biases are added per row; fc2's only
    with fc2_bias (else the caller adds it: experts split over TP, experts.py)."""
    h = grouped_linear(x, [e.fc1_weight for e in experts], [e.fc1_bias for e in experts], counts)
    h = experts[0].activation(h)
    return grouped_linear(h, [e.fc2_weight for e in experts], [e.fc2_bias if fc2_bias else None for e in experts],
                          counts)


def per_row(biases, counts, rows):
    """[G, n] biases -> [rows, n], bias g repeated for each of group g's rows (counts: TokenCounts)."""
    return F.embedding(counts.groups(rows), biases)
