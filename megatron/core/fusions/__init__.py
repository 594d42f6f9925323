"""One front per fused op: each picks our csrc kernel, apex, Transformer Engine, flash-attn
or plain torch by availability and the config's flags, and always falls back to torch.

    attention.CoreAttention           --attention-backend auto|flash|te|sdpa|unfused
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
    c, dtype = config, config.params_dtype
    backend = attention.select(c.attention_backend, device, dtype)
    attn = attention.NAMES[backend]
    if backend == "unfused":
        attn += ", softmax " + softmax.select(c.masked_softmax_fusion, device, dtype, causal=True)
    ops = [("attention", attn),
           (c.normalization, norm.select(c.norm_fusion, device, dtype)),
           ("bias-swiglu" if c.swiglu else "bias-gelu",
            activations.select(c.bias_swiglu_fusion if c.swiglu else c.bias_gelu_fusion, device, dtype))]
    if c.position_embedding_type == "rope":
        ops.append(("rope", rope.select(c.apply_rope_fusion, device, dtype)))
    return ops


def kernels_status():
    """One line on our csrc kernels: loaded from where, or why not."""
    _ext.load()
    return _ext.status()


def check_config(config):
    """Raise ConfigError when an explicitly requested backend cannot run here (before any process group)."""
    from ..config import ConfigError, TransformerConfig, flag_of
    backend = config.attention_backend
    if backend in ("flash", "te"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        ok, reason = attention.available(backend, device, config.params_dtype)
        if not ok:
            raise ConfigError(f"{flag_of(TransformerConfig, 'attention_backend')} {backend}: {reason}; "
                              "use auto, sdpa or unfused")
