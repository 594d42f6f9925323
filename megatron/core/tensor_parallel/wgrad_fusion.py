"""Gradient-accumulation fusion (--gradient-accumulation-fusion, Megatron-LM's; on by default): the
weight-gradient GEMM of a linear layer adds g^T x straight into the parameter's main gradient (DDP's
fp32 buffer) with beta 1, so no gradient tensor of the parameter's dtype is made and no separate
main_grad += grad pass runs.

The contract: where a weight's gradient goes is its ParamMeta.grad_sink, which DDP sets when it is built
with gradient_accumulation_fusion. sink.grad_target(param) is the full-shape buffer to add into (DDP
allocates and zeroes a released ZeRO bucket first); sink.grad_added(param) tells DDP that this backward's
gradient is in, as its post-accumulate-grad hook does for a .grad. That hook does not run for a fused
weight: the functions here see the weight detached, so autograd has no edge to it. A weight without a
sink gets its gradient through autograd, as before. DDP counts one gradient per parameter per
microbatch: a weight with two uses in one backward must not be fused (the tied word table on a stage
that also looks it up: language_module.logits).

The buffer is zeroed by DDP before the first microbatch (start_step, as without fusion), so every
microbatch adds with beta 1; none writes with beta 0.

The product, g [t, out] and x [t, in] -> main [out, in] += g^T x (fp32 accumulation):
  - "csrc": csrc/fused/bind_wgrad.cpp, cublasGemmEx on torch's stream and handle, on CUDA with an fp32
    buffer and bf16 / fp16 / fp32 operands, where the extension is built;
  - "torch" otherwise, the same arithmetic: main.addmm_(g^T, x) when the dtypes agree (fp32 training; a
    bf16 buffer with --grad-reduce-in-bf16), else the product in fp32 added (torch.mm(..., out_dtype)
    on CUDA, fp32 operands on the CPU).
"""
import torch
import torch.nn.functional as F

from .. import comm
from ..fusions import _ext
from .param_meta import param_meta


def _csrc_module(main, g, x):
    if not (main.dtype == torch.float32 and g.dtype == x.dtype):
        return None
    module = _ext.load()
    return module if module is not None and hasattr(module, "wgrad_gemm_accumulate") else None


def impl(device) -> str:
    """Which implementation accumulates on `device`: 'csrc' or 'torch' (the start-up log)."""
    if torch.device(device).type != "cuda":
        return "torch"
    module = _ext.load()
    return "csrc" if module is not None and hasattr(module, "wgrad_gemm_accumulate") else "torch"


def _torch_accumulate(x, g, main):
    if main.is_cuda:
        main.add_(torch.mm(g.t(), x, out_dtype=main.dtype))
    else:
        main.addmm_(g.t().to(main.dtype), x.to(main.dtype))


def _cuda_accumulate(x, g, main):
    module = _csrc_module(main, g, x)
    if module is None or not module.wgrad_gemm_accumulate(x.contiguous(), g.contiguous(), main):
        _torch_accumulate(x, g, main)


def _register_operator():
    """megatron::wgrad_accumulate(x, g, main!): one operator, as the GPU runs one GEMM, also where torch
    needs several (converting bf16 operands on the CPU): what a dispatch-mode count of the step sees."""
    if hasattr(torch.ops.megatron, "wgrad_accumulate"):  # defined by an earlier import of this file
        return None
    lib = torch.library.Library("megatron", "FRAGMENT")
    lib.define("wgrad_accumulate(Tensor x, Tensor g, Tensor(a!) main) -> ()")
    lib.impl("wgrad_accumulate", _torch_accumulate, "CPU")
    lib.impl("wgrad_accumulate", _cuda_accumulate, "CUDA")
    return lib


_OPERATOR = _register_operator()  # kept: the registration lives as long as the library object


@torch.no_grad()  # also when called outside a backward: a zero-bubble W action runs with grad mode on
def accumulate(main, g, x):
    """main [out, in] += g^T x for g [t, out] and x [t, in] (2-D), accumulated in main's precision."""
    if g.dtype == main.dtype and x.dtype == main.dtype and _csrc_module(main, g, x) is None:
        main.addmm_(g.t(), x)
    else:
        torch.ops.megatron.wgrad_accumulate(x, g, main)


def fusable(weight) -> bool:
    """Whether `weight`'s gradient would go to a grad sink in this forward."""
    return weight.requires_grad and torch.is_grad_enabled() and param_meta(weight).grad_sink is not None


def weight_gradient(param, g, x):
    """The gradient of y = x param^T for flat g [t, out] and x [t, in]: returned ([out, in]), or, where
    param has a grad sink, added into it and None returned."""
    sink = param_meta(param).grad_sink
    if sink is None:
        return g.t().mm(x)
    accumulate(sink.grad_target(param), g, x)
    sink.grad_added(param)
    return None


def _flat(t):
    return t.reshape(-1, t.shape[-1])


class _Linear(torch.autograd.Function):
    """y = x W^T (+ b), W's gradient to its grad sink. With gather_group, x is this rank's sequence
    shard [s/TP, ...] and the product uses the gathered [s, ...]; the shard is what is kept (sequence
    parallelism, gathered again in the backward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, gather_group, anchor, param):
        ctx.save_for_backward(x)
        ctx.weight, ctx.group, (ctx.param,) = weight, gather_group, param
        total = comm.all_gather_dim0(x, gather_group) if gather_group is not None else x
        return F.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad_x = grad.matmul(ctx.weight) if ctx.needs_input_grad[0] else None
        total = x
        if ctx.group is not None:
            if grad_x is not None:
                grad_x = comm.reduce_scatter_dim0(grad_x, ctx.group)  # partial sums over TP
            total = comm.all_gather_dim0(x, ctx.group)
        g = _flat(grad)
        weight_gradient(ctx.param, g, _flat(total))
        grad_bias = g.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, None, grad_bias, None, None, None


def linear(x, weight, bias=None, gather_group=None):
    """F.linear(x [..., in], weight [out, in], bias [out]) -> [..., out] with weight's gradient added
    into its grad sink (fusable(weight) must hold). gather_group: all-gather x along dim 0 over that TP
    group first (sequence parallelism)."""
    # an empty leaf keeps the output in the graph when nothing else it depends on requires grad
    anchor = None if x.requires_grad else torch.empty(0, device=x.device, requires_grad=True)
    # the parameter inside a tuple: autograd does not look there, so it has no edge to it
    return _Linear.apply(x, weight.detach(), bias, gather_group, anchor, (weight,))


def linear_or_fused(x, weight, bias=None):
    """F.linear(x, weight, bias), through linear() where weight's gradient goes to a grad sink."""
    return linear(x, weight, bias) if fusable(weight) else F.linear(x, weight, bias)


class _BiasGrad(torch.autograd.Function):
    """y unchanged; the bias's gradient is the sum of y's (or zero): for a row-parallel layer whose
    bias another TP rank added inside its GEMM (layers.RowParallelLinear)."""

    @staticmethod
    def forward(ctx, y, bias, counted):
        ctx.counted = counted
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        g = _flat(grad)
        return grad, (g.sum(0) if ctx.counted else g.new_zeros(g.shape[-1])), None


def bias_grad_only(y, bias, counted):
    """y [..., out] as it is, with bias [out] receiving y's gradient summed (counted) or zeros."""
    return _BiasGrad.apply(y, bias, counted)
