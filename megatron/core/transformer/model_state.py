"""Model state that is not trained: tensors a checkpoint holds beside the parameters.

The optimizer's state pieces cover the trainable parameters only; a tensor that changes during
training by another rule and decides the model's output (today: the MoE routers' expert bias of
aux-loss-free balancing) is listed here, so save and load reach it through one function rather
than by walking module attributes.
"""
from .moe.router import TopKRouter


def non_trained_state(model):
    """[(layout-free key, tensor)] of this rank's non-trained model state, in module order.

    model: an nn.Module (one model, or a list of pipeline chunks). Each tensor is replicated over
    every rank that holds its layer (TP, DP, CP, EP), like a TP-replicated parameter, so a
    checkpoint writes it once (param_meta.counted_once and data-parallel replica 0) and any layout
    loads it whole. No communication.
    """
    return [kv for m in model.modules() if isinstance(m, TopKRouter) for kv in m.bias_state()]
