"""Gradient-accumulation fusion (--gradient-accumulation-fusion, Megatron-LM's; on by default): the
weight-gradient GEMM of a linear layer adds g^T x straight into the parameter's main gradient (DDP's
fp32 buffer) with beta 1, so no gradient tensor of the parameter's dtype is made and no separate
main_grad += grad pass runs.

The contract: where a weight's gradient goes is its ParamMeta.grad_sink, which DDP sets when it is built
with gradient_accumulation_fusion. sink.grad_target(param) is the full-shape buffer to add into (DDP
allocates and zeroes a released ZeRO bucket first); sink.grad_is_first(param) says whether no gradient of
param has arrived yet this step (the buffer then holds the last step's: the product is written, beta 0,
instead of added); sink.grad_added(param) tells DDP that this backward's
gradient is in, as its post-accumulate-grad hook does for a .grad. The weight stays a real input of the
functions here (the zero-bubble split needs its edge), whose backward returns None for a fused weight:
no .grad is made, and DDP's hook, which torch may still run, finds none and does nothing. A weight
without a sink gets its gradient through autograd, as before. DDP counts one gradient per parameter per
microbatch: a weight with two uses in one backward must not be fused (the tied word table on a stage
that also looks it up: language_module.logits).

DDP does not zero its buffer before a step: each parameter's first gradient of the step writes (beta 0, no
read of the buffer), later ones add (beta 1), and finish_grad_sync zeroes what no gradient reached.

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
from ..backward_needs import needs_grad
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


def _torch_accumulate(x, g, main, accumulate=True):
    if main.is_cuda:
        product = torch.mm(g.t(), x, out_dtype=main.dtype)
        main.add_(product) if accumulate else main.copy_(product)
    elif accumulate:
        main.addmm_(g.t().to(main.dtype), x.to(main.dtype))
    else:
        torch.mm(g.t().to(main.dtype), x.to(main.dtype), out=main)


def _cuda_accumulate(x, g, main, accumulate=True):
    module = _csrc_module(main, g, x)
    if module is None or not module.wgrad_gemm_accumulate(x.contiguous(), g.contiguous(), main, accumulate):
        _torch_accumulate(x, g, main, accumulate)


def _register_operator():
    """megatron::wgrad_accumulate(x, g, main!, accumulate): one operator (accumulate false: main = g^T x),
    as the GPU runs one GEMM, also where torch needs several (converting bf16 operands on the CPU): what a
    dispatch-mode count of the step sees."""
    if hasattr(torch.ops.megatron, "wgrad_accumulate"):  # defined by an earlier import of this file
        return None
    lib = torch.library.Library("megatron", "FRAGMENT")
    lib.define("wgrad_accumulate(Tensor x, Tensor g, Tensor(a!) main, bool accumulate=True) -> ()")
    lib.impl("wgrad_accumulate", _torch_accumulate, "CPU")
    lib.impl("wgrad_accumulate", _cuda_accumulate, "CUDA")
    return lib


_OPERATOR = _register_operator()  # kept: the registration lives as long as the library object


@torch.no_grad()  # also when called outside a backward: a zero-bubble W action runs with grad mode on
def accumulate(main, g, x, first=False):
    """main [out, in] += g^T x for g [t, out] and x [t, in] (2-D), accumulated in main's precision;
    first: main = g^T x (main is not read)."""
    if g.dtype == main.dtype and x.dtype == main.dtype and _csrc_module(main, g, x) is None:
        main.addmm_(g.t(), x) if not first else torch.mm(g.t(), x, out=main)
    else:
        torch.ops.megatron.wgrad_accumulate(x, g, main, not first)


def fusable(weight) -> bool:
    """Whether `weight`'s gradient would go to a grad sink in this forward (not inside a compiled layer:
    there the compiled backward returns it and DDP's hook adds it, compiled_layers.py)."""
    if torch.compiler.is_compiling():
        return False
    return weight.requires_grad and torch.is_grad_enabled() and param_meta(weight).grad_sink is not None


def weight_gradient(param, g, x):
    """The gradient of y = x param^T for flat g [t, out] and x [t, in]: returned ([out, in]), or, where
    param has a grad sink, added into it and None returned."""
    sink = param_meta(param).grad_sink
    if sink is None:
        return g.t().mm(x)
    accumulate(sink.grad_target(param), g, x, sink.grad_is_first(param))
    sink.grad_added(param)
    return None


def deposit(param, grad):
    """A weight gradient computed elsewhere (the grouped experts' one grouped matmul for all of them):
    into param's grad sink where it has one (None returned), else returned, as autograd's."""
    sink = param_meta(param).grad_sink
    if sink is None:
        return grad
    with torch.no_grad():  # a zero-bubble W runs with grad mode on
        target = sink.grad_target(param)
        target.copy_(grad) if sink.grad_is_first(param) else target.add_(grad)
    sink.grad_added(param)
    return None


def _flat(t):
    return t.reshape(-1, t.shape[-1])


class _Linear(torch.autograd.Function):
    """y = x W^T (+ b), W's gradient to its grad sink where it has one (else returned, as autograd's).
    With gather_group, x is this rank's sequence shard [s/TP, ...] and the product uses the gathered
    [s, ...]; the shard is what is kept (sequence parallelism, gathered again in the backward).

    W is a real input: its edge is what a zero-bubble split (pipeline_parallel/backward_split.py) finds
    the weight work by. Each part of the backward runs only where the running backward uses it
    (backward_needs.needs_grad): a B, restricted to the stage input, computes the input gradient (and its
    reduce-scatter), a W the all-gather and the accumulation into the sink; an ordinary backward both.
    For a fused weight the backward returns None: autograd still runs the weight's AccumulateGrad (torch
    2.13 fires its post-accumulate-grad hook with .grad unchanged, None), which DDP ignores; the sink was
    told by grad_added, once, where the accumulation happened."""

    @staticmethod
    def forward(ctx, x, weight, bias, gather_group):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.has_bias = gather_group, bias is not None
        total = comm.all_gather_dim0(x, gather_group) if gather_group is not None else x
        return F.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = _flat(grad)
        grad_x = grad_weight = grad_bias = None
        if needs_grad(ctx, 0):
            grad_x = grad.matmul(weight)
            if ctx.group is not None:
                grad_x = comm.reduce_scatter_dim0(grad_x, ctx.group)  # partial sums over TP
        if needs_grad(ctx, 1):
            total = comm.all_gather_dim0(x, ctx.group) if ctx.group is not None else x
            grad_weight = weight_gradient(weight, g, _flat(total))
        if ctx.has_bias and needs_grad(ctx, 2):
            grad_bias = g.sum(0)
        return grad_x, grad_weight, grad_bias, None


def linear(x, weight, bias=None, gather_group=None):
    """F.linear(x [..., in], weight [out, in], bias [out]) -> [..., out] with weight's gradient added
    into its grad sink where it has one. gather_group: all-gather x along dim 0 over that TP group first
    (sequence parallelism; the gathered input is not kept for the backward)."""
    return _Linear.apply(x, weight, bias, gather_group)


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
        grad_bias = None
        if needs_grad(ctx, 1):  # in a zero-bubble W, not B
            g = _flat(grad)
            grad_bias = g.sum(0) if ctx.counted else g.new_zeros(g.shape[-1])
        return (grad if needs_grad(ctx, 0) else None), grad_bias, None


def bias_grad_only(y, bias, counted):
    """y [..., out] as it is, with bias [out] receiving y's gradient summed (counted) or zeros."""
    return _BiasGrad.apply(y, bias, counted)
