"""Model state that is not trained: tensors a checkpoint holds beside the parameters.

The optimizer's state pieces cover the trainable parameters only; a tensor that changes during
training by another rule and decides the model's output (the MoE routers' expert bias of aux-loss-free
balancing; FP8 delayed scaling's amax histories and scales) is listed here, so save and load reach it
through one function rather than by walking module attributes.
"""
from ..models.common.language_module import LanguageModule
from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from ..tensor_parallel.param_meta import param_meta
from .moe.experts import ExpertMLP
from .moe.router import TopKRouter


def _fp8_state(linear):
    """[(key, tensor)] of an FP8 linear's delayed-scaling buffers: the weight's init_key with
    `fp8.<tensor>.<buffer>` for `weight` (layout-free; after each step's reduction every rank holding
    the layer has the same values)."""
    if linear.fp8 is None:
        return []
    base = param_meta(linear.weight).init_key.removesuffix("weight") + "fp8."
    return [(base + name, t) for name, t in linear.fp8.named_buffers()]


def _expert_fp8_state(expert):
    """The same for an expert's two FP8 GEMMs: `fc1_fp8.<tensor>.<buffer>`, `fc2_fp8...` beside its weights."""
    if expert.fc1_fp8 is None:
        return []
    base = param_meta(expert.fc1_weight).init_key.removesuffix("fc1_weight")
    return [(f"{base}{which}.{name}", t) for which in ("fc1_fp8", "fc2_fp8")
            for name, t in getattr(expert, which).named_buffers()]


def non_trained_state(model):
    """[(layout-free key, tensor)] of this rank's non-trained model state, in module order.

    model: an nn.Module (one model, or a list of pipeline chunks). Each tensor is replicated over
    every rank that holds its layer (TP, DP, CP, EP), like a TP-replicated parameter, so a
    checkpoint writes it once (param_meta.counted_once and data-parallel replica 0) and any layout
    loads it whole. No communication.
    """
    out = []
    for m in model.modules():
        if isinstance(m, LanguageModule) and m.output_fp8 is not None:  # the tied table's FP8 GEMM
            out += [("output_layer.fp8." + name, t) for name, t in m.output_fp8.named_buffers()]
        if isinstance(m, TopKRouter):
            out += m.bias_state()
        elif isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            out += _fp8_state(m)
        elif isinstance(m, ExpertMLP):
            out += _expert_fp8_state(m)
    return out
