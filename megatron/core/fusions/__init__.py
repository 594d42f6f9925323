"""One front per fused op: each picks our csrc kernel, apex, Transformer Engine, flash-attn
or plain torch by availability and the config's flags, and always falls back to torch.

    attention.sdpa / flash / unfused / build_te   --attention-backend auto|flash|fused|te|sdpa|local|unfused
                                      (transformer/core_attention.py picks one per call)
    softmax.scaled_masked_softmax / scaled_upper_triang_masked_softmax   --no-masked-softmax-fusion
    norm.layer_norm / rms_norm        --no-norm-fusion
    activations.bias_gelu / bias_swiglu   --no-bias-gelu-fusion / --no-bias-swiglu-fusion
    rope.apply_rope                   --no-rope-fusion
    (tensor_parallel) wgrad_fusion    --no-gradient-accumulation-fusion
    (tensor_parallel) cross_entropy_fused   --cross-entropy-loss-fusion

Modules choose once, at construction (select(...) with the device and dtype they are built
for, through kernel_table.choose: our kernel only where a GPU result on file beats eager torch
and torch.compile on this GPU, unless a flag says otherwise); a call whose tensors the chosen
kernel cannot take (CPU tensors, another dtype) runs torch instead. explain() and describe()
report the choices the same way, for the start-up log.
"""
import torch

from . import _common, _ext, activations, attention, kernel_table, norm, rope, softmax


def explain(config, device):
    """[(op, implementation, why)] for the fused ops `config`'s model uses on `device`, as its modules pick them."""
    dtype, force = config.params_dtype, config.fused_kernels
    ops = []
    if attention.select(config.attention_backend, device, dtype) == "unfused":
        ops.append(("causal softmax", *softmax.choice(config.masked_softmax_fusion, device, dtype, True, force)))
        ops.append(("masked softmax", *softmax.choice(config.masked_softmax_fusion, device, dtype, False, force)))
    ops.append((config.normalization, *norm.choice(config.norm_fusion, device, dtype,
                                                    config.normalization == "RMSNorm", force)))
    if config.swiglu:
        ops.append(("bias-swiglu", *activations.choice(config.bias_swiglu_fusion, device, dtype, True, force)))
    else:
        ops.append(("bias-gelu", *activations.choice(config.bias_gelu_fusion, device, dtype, False, force)))
    if config.position_embedding_type == "rope":
        ops.append(("rope", *rope.choice(config.apply_rope_fusion, device, dtype, force)))
    return ops


def describe(config, device):
    """[(op, implementation)] for the ops `config`'s model uses on `device`, as its modules pick them."""
    backend = attention.select(config.attention_backend, device, config.params_dtype)
    choices = explain(config, device)
    attn = attention.NAMES[backend]
    if config.attention_backend == "fused" and backend == "sdpa":
        attn += " (--attention-backend fused: no Transformer Engine, and no cuDNN without CUDA)"
    if backend == "unfused":
        attn += ", softmax " + choices[0][1] + ", masked softmax " + choices[1][1]
        choices = choices[2:]
    ops = [("attention", attn)] + [(op, impl) for op, impl, _ in choices]
    if config.context_parallel_size > 1 and config.cp_comm_type == "p2p":
        from ..transformer.ring_kernels import choose_kernel, usable_kernels
        device = torch.device(device)
        ops.append(("ring-attention-blocks",
                    choose_kernel(device.type, config.params_dtype, config.kv_channels, usable_kernels(device))))
    from ..tensor_parallel import cross_entropy_fused, wgrad_fusion  # here: tensor_parallel imports this package
    ops.append(("weight-gradient accumulation", f"in the GEMM ({wgrad_fusion.impl(device)})"
                if config.gradient_accumulation_fusion else "off (a .grad, then added)"))
    ops.append(("cross entropy", cross_entropy_fused.implementation(device) if config.cross_entropy_loss_fusion
                else "vocab-parallel (torch)"))
    if config.residual_norm_fusion:
        from ..transformer.model_options import recomputes  # here: transformer imports this package
        fits = torch.device(device).type == "cuda" and _common.importable("triton")
        if config.post_norm or recomputes(config, "layernorm"):
            how = "the add, then the norm (--residual-norm-fusion: pre-norm layers without norm recompute only)"
        else:
            how = "one kernel (torch.compile; --residual-norm-fusion)" if fits else \
                "the add, then the norm (--residual-norm-fusion compiles on CUDA with triton only)"
        ops.append(("residual add + norm", how))
    return ops


def kernels_status():
    """One line on our csrc kernels: loaded from where, or why not."""
    _ext.load()
    return _ext.status()


def check_config(config):
    """Raise ConfigError when an explicitly requested backend cannot run here (before any process group)."""
    from ..config import ConfigError, TransformerConfig, flag_of
    try:
        kernel_table.load(kernel_table.table_path())
    except kernel_table.KernelTableError as e:
        raise ConfigError(f"{e}; fix it, or unset {kernel_table.ENV} to use the committed table") from None
    backend = attention.ALIASES.get(config.attention_backend, config.attention_backend)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if config.transformer_impl == "transformer_engine":
        ok, reason = attention.available("te", device, config.params_dtype)
        if not ok:
            raise ConfigError(f"--transformer-impl transformer_engine: {reason}; use --transformer-impl local "
                              "(this project's own layers)")
    if backend in ("flash", "te"):
        ok, reason = attention.available(backend, device, config.params_dtype)
        if not ok:
            flag = flag_of(TransformerConfig, 'attention_backend')
            raise ConfigError(f"{flag} {config.attention_backend}: {reason}; use auto, sdpa or unfused")
