"""--moe-grouped-gemm: the local experts' matmuls as one grouped matmul per projection.

torch._grouped_mm where this torch has it and the shapes suit it (rows of 16-byte multiples),
else a loop of matmuls: the same products, so the same numbers. Its backward is written here
(grouped for the input gradient, a loop for the weights'): torch's own fails on CPU.
Under zero-bubble schedules (weight_grad.splitting) the weights' loop is deferred to the W action.
"""
import torch
import torch.nn.functional as F

from ...tensor_parallel import weight_grad

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
        dx = _mm(g.contiguous(), w.transpose(1, 2), counts)
        dw = torch.stack([xi.t() @ gi for xi, gi in zip(x.split(counts), g.split(counts))])
        return dx, dw, None


def grouped_mm(x, w, counts):
    """Differentiable grouped matmul: rows of x split by counts (list of ints), group g times w[g]."""
    return _GroupedMM.apply(x, w, list(counts))


def grouped_experts(experts, x, counts, fc2_bias=True):
    """The ExpertMLPs `experts` on x [N, h] sorted by expert (counts rows each) -> [N, h], as two
    grouped matmuls (fc1, fc2) with the activation between. Biases are added per row; fc2's only
    with fc2_bias (else the caller adds it: experts split over TP, experts.py)."""
    fc2_biases = [e.fc2_bias if fc2_bias else None for e in experts]
    if weight_grad.split_enabled():
        h = experts[0].activation(grouped_linear(x, [e.fc1_weight for e in experts], [e.fc1_bias for e in experts],
                                                 counts))
        return grouped_linear(h, [e.fc2_weight for e in experts], fc2_biases, counts)
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


class _DeferredGroupedLinear(torch.autograd.Function):
    """Rows of x [N, in] split by counts, group g times w[g] [in, out] (+ b[g] [out]): the products
    and the input gradient of _GroupedMM, the weights' (and biases') gradients through
    weight_grad.now_or_later, so inside a B action they wait for W. w and b are the parameters
    stacked detached (params: the parameters themselves, weights then biases)."""

    @staticmethod
    def forward(ctx, x, w, b, counts, anchor, params):
        ctx.save_for_backward(x, w)
        ctx.counts, ctx.params = counts, params
        y = _mm(x, w, counts)
        return y if b is None else y + per_row(b, counts)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        counts, params, g = ctx.counts, ctx.params, g.contiguous()
        dx = _mm(g, w.transpose(1, 2), counts) if ctx.needs_input_grad[0] else None
        biases = len(params) > len(counts)

        def weight_grads():  # [out, in] per weight, as _GroupedMM's [in, out] product transposed
            pairs = list(zip(x.split(counts), g.split(counts)))
            return [(xi.t() @ gi).t() for xi, gi in pairs] + ([gi.sum(0) for _, gi in pairs] if biases else [])

        weight_grad.now_or_later(params, weight_grads)
        return dx, None, None, None, None, None


def grouped_linear(x, weights, biases, counts):
    """x [N, in] sorted by group (counts rows each) -> [N, out], row block g through weights[g]
    [out, in] (+ biases[g] [out], or all None): one grouped matmul whose weight gradients are
    deferrable (zero-bubble schedules). No communication."""
    w = torch.stack([p.detach() for p in weights]).transpose(1, 2)
    b = None if biases[0] is None else torch.stack([p.detach() for p in biases])
    params = tuple(weights) + (() if b is None else tuple(biases))
    return _DeferredGroupedLinear.apply(x, w, b, list(counts), weight_grad.anchor(x), params)
