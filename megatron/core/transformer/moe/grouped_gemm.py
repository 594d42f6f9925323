"""--moe-grouped-gemm: the local experts' matmuls as one grouped matmul per projection.

torch._grouped_mm where this torch has it and the shapes suit it (rows of 16-byte multiples),
else a loop of matmuls: the same products, so the same numbers. Its backward is written here
(grouped for the input gradient, a loop for the weights'): torch's own fails on CPU. Each part runs
only where the running backward uses it (backward_needs.py: a zero-bubble B the input's, W the weights').
"""
import torch
import torch.nn.functional as F

from ...backward_needs import needs_grad

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
    fc1 = torch.stack([e.fc1_weight for e in experts]).transpose(1, 2)
    fc2 = torch.stack([e.fc2_weight for e in experts]).transpose(1, 2)
    h = grouped_mm(x, fc1, counts)
    if experts[0].fc1_bias is not None:
        h = h + per_row(torch.stack([e.fc1_bias for e in experts]), counts)
    h = experts[0].activation(h)
    out = grouped_mm(h, fc2, counts)
    if fc2_biases[0] is not None:
        out = out + per_row(torch.stack(fc2_biases), counts)
    return out


def per_row(biases, counts):
    """[G, n] biases -> [N, n], bias g repeated counts[g] times."""
    return F.embedding(torch.repeat_interleave(torch.arange(len(counts), device=biases.device),
                                               torch.tensor(counts, device=biases.device)), biases)
