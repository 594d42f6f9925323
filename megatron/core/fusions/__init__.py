"""One front per fused op: each picks our csrc kernel, apex, Transformer Engine, flash-attn
or plain torch by availability and the config's flags, and always falls back to torch.

    attention.sdpa / flash / unfused / build_te   --attention-backend auto|flash|fused|te|sdpa|local|unfused
                                      (transformer/core_attention.py picks one per call)
    softmax.scaled_masked_softmax / scaled_upper_triang_masked_softmax   --no-masked-softmax-fusion
    norm.layer_norm / rms_norm        --no-norm-fusion
    activations.bias_gelu / bias_swiglu   --no-bias-gelu-fusion / --no-bias-swiglu-fusion
    rope.apply_rope                   --no-rope-fusion

Modules choose once, at construction (select(...) with the device and dtype they are built
for); a call whose tensors the chosen kernel cannot take (CPU tensors, another dtype) runs
torch instead. describe() reports the choices the same way, for the start-up log.
"""
import torch

from . import _ext, activations, attention, norm, rope, softmax


def describe(config, device):
    """[(op, implementation)] for the ops `config`'s model uses on `device`, as its modules pick them."""
    dtype = config.params_dtype
    backend = attention.select(config.attention_backend, device, dtype)
    attn = attention.NAMES[backend]
    if backend == "unfused":
        attn += ", softmax " + softmax.select(config.masked_softmax_fusion, device, dtype, causal=True)
    fused_activation = config.bias_swiglu_fusion if config.swiglu else config.bias_gelu_fusion
    ops = [("attention", attn),
           (config.normalization, norm.select(config.norm_fusion, device, dtype)),
           ("bias-swiglu" if config.swiglu else "bias-gelu", activations.select(fused_activation, device, dtype))]
    if config.position_embedding_type == "rope":
        ops.append(("rope", rope.select(config.apply_rope_fusion, device, dtype)))
    if config.context_parallel_size > 1 and config.cp_comm_type == "p2p":
        from ..transformer.ring_kernels import choose_kernel, usable_kernels
        device = torch.device(device)
        ops.append(("ring-attention-blocks",
                    choose_kernel(device.type, dtype, config.kv_channels, usable_kernels(device))))
    return ops


def kernels_status():
    """One line on our csrc kernels: loaded from where, or why not."""
    _ext.load()
    return _ext.status()


def check_config(config):
    """Raise ConfigError when an explicitly requested backend cannot run here (before any process group)."""
    from ..config import ConfigError, TransformerConfig, flag_of
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
