"""--moe-grouped-gemm: the local experts' matmuls as one grouped matmul per projection.

torch._grouped_mm where this torch has it and the shapes suit it (rows of 16-byte multiples),
else a loop of matmuls: the same products, so the same numbers. Its backward is written here
(grouped for the input gradient, a loop for the weights'): torch's own fails on CPU. Each part runs
only where the running backward uses it (backward_needs.py: a zero-bubble B the input's, W the weights').
"""
import torch
import torch.nn.functional as F

from ...backward_needs import needs_grad
from ...tensor_parallel import wgrad_fusion

_HAS_GROUPED = hasattr(torch, "_grouped_mm")


def _fits(x, w):
    # CUDA kernels take bf16 only (Hopper and later); the CPU one takes fp32 too
    dtypes = (torch.float32, torch.bfloat16) if x.device.type == "cpu" else (torch.bfloat16,)
    return (_HAS_GROUPED and x.dtype in dtypes and x.dtype == w.dtype
            and all(d * x.element_size() % 16 == 0 for d in (x.shape[1], w.shape[2])))


def _mm(x, w, counts):
    """[N, K] x [G, K, M] with counts[g] rows for group g (offs) -> [N, M]."""
    if _fits(x, w):
        offs = torch.cumsum(torch.tensor(counts, device=x.device), 0).to(torch.int32)
        try:
            return torch._grouped_mm(x, w, offs=offs)
        except RuntimeError:  # a GPU or layout this torch's kernel refuses: the loop gives the same products
            pass
    outs = [chunk @ w[g] for g, chunk in enumerate(x.split(counts))]
    return torch.cat(outs) if outs else x.new_zeros(0, w.shape[2])


class _GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, counts):
        ctx.save_for_backward(x, w)
        ctx.counts = counts
        return _mm(x, w, counts)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        counts = ctx.counts
        dx = _mm(g.contiguous(), w.transpose(1, 2), counts) if needs_grad(ctx, 0) else None
        dw = torch.stack([xi.t() @ gi for xi, gi in zip(x.split(counts), g.split(counts))]) if needs_grad(ctx, 1) \
            else None
        return dx, dw, None


def grouped_mm(x, w, counts):
    """Differentiable grouped matmul: rows of x split by counts (list of ints), group g times w[g]."""
    return _GroupedMM.apply(x, w, list(counts))


def grouped_experts(experts, x, counts, fc2_bias=True):
    """The ExpertMLPs `experts` on x [N, h] sorted by expert (counts rows each) -> [N, h], as two
    grouped matmuls (fc1, fc2) with the activation between. Biases are added per row; fc2's only
    with fc2_bias (else the caller adds it: experts split over TP, experts.py)."""
    fc2_biases = [e.fc2_bias if fc2_bias else None for e in experts]
    if wgrad_fusion.fusable(experts[0].fc1_weight):  # gradient-accumulation fusion: into DDP's buffer
        def product(y, weights):
            return grouped_linear(y, weights, counts)
    else:
        def product(y, weights):
            return grouped_mm(y, torch.stack(weights).transpose(1, 2), counts)
    h = product(x, [e.fc1_weight for e in experts])
    if experts[0].fc1_bias is not None:
        h = h + per_row(torch.stack([e.fc1_bias for e in experts]), counts)
    h = experts[0].activation(h)
    out = product(h, [e.fc2_weight for e in experts])
    if fc2_biases[0] is not None:
        out = out + per_row(torch.stack(fc2_biases), counts)
    return out


def per_row(biases, counts):
    """[G, n] biases -> [N, n], bias g repeated counts[g] times."""
    return F.embedding(torch.repeat_interleave(torch.arange(len(counts), device=biases.device),
                                               torch.tensor(counts, device=biases.device)), biases)


class _GroupedLinear(torch.autograd.Function):
    """_GroupedMM with the weights [out, in] as inputs of their own: each one's gradient goes through
    wgrad_fusion.weight_gradient (into its grad sink, the function returning None for it), and each is
    an edge of the graph for the zero-bubble split."""

    @staticmethod
    def forward(ctx, x, *weights_counts):  # counts last: needs_grad indexes the tensor inputs
        *weights, counts = weights_counts
        w = torch.stack(weights).transpose(1, 2)
        ctx.save_for_backward(x, w)
        ctx.counts, ctx.weights = counts, weights
        return _mm(x, w, counts)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        counts, g = ctx.counts, g.contiguous()
        dx = _mm(g, w.transpose(1, 2), counts) if needs_grad(ctx, 0) else None
        pairs = zip(ctx.weights, x.split(counts), g.split(counts))
        dws = [wgrad_fusion.weight_gradient(p, gi, xi) if needs_grad(ctx, 1 + i) else None
               for i, (p, xi, gi) in enumerate(pairs)]
        return (dx, *dws, None)


def grouped_linear(x, weights, counts):
    """x [N, in] sorted by group (counts rows each) -> [N, out], row block g through weights[g] [out, in],
    whose gradients go to their grad sinks (gradient-accumulation fusion)."""
    return _GroupedLinear.apply(x, *weights, list(counts))
