"""After a step's backward, before its optimizer step (whose gather casts the FP8 weights with the new scales
under --fp8-param-gather): delayed scaling's amax histories take the step's amaxes (scalers.py)."""
from .scalers import DelayedScaler


def delayed_scalers(model):
    """The DelayedScalers of a model (an nn.Module, or a list of pipeline chunks), in module order: the
    same order on every rank of a group, so their reductions pair up."""
    chunks = model if isinstance(model, (list, tuple)) else [model]
    return [m for chunk in chunks for m in chunk.modules() if isinstance(m, DelayedScaler)]


def after_step(model, groups):
    """Push each delayed scaler's step amax, reduced over its pieces' groups and groups.dp_cp (the
    data-parallel ranks that ran the step's other microbatches; None: one process), or for an expert's
    groups.edp (the ranks holding the same expert: under expert parallelism DP x CP ranks hold other
    experts), and recompute its scale. Without delayed scalers nothing is read."""
    for scaler in delayed_scalers(model):
        if groups is None:
            scaler.update(())
        else:
            scaler.update((groups.edp if scaler.expert and groups.edp is not None else groups.dp_cp,))
