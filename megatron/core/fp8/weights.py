"""Which parameters are FP8 linears' weights, and whose recipe casts each: the layers that run a GEMM in FP8
answer fp8_weights() (tensor_parallel/layers.py, moe/experts.py); --fp8-param-gather keeps these weights in
buffers of their own and gathers them as FP8 bytes (distributed/fp8_param_gather.py)."""


def fp8_weight_pairs(module):
    """[(weight, recipe)] of every FP8 GEMM's weight in `module` (an nn.Module or a list of chunks), in module
    order; the first-last-layers-bf16 layers' linears and those without FP8 are not among them. Only per-tensor
    recipes (tensorwise, delayed): --fp8-param-gather is refused with blockwise (config.check_fp8)."""
    chunks = module if isinstance(module, (list, tuple)) else [module]
    return [pair for chunk in chunks for m in chunk.modules() if hasattr(m, "fp8_weights") for pair in m.fp8_weights()]
