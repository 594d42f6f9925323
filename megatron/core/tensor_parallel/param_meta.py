"""What each parameter is: the one place that records and answers it.

Parameters differ in how they are initialised, split over TP, reduced and counted.
Each nn.Parameter carries one typed record, ParamMeta, written where the parameter is
made (parallel layers, norms, models) through the set_* functions here and read only
through `param_meta` and the rules below: initialisation, finalize_model_grads, the
optimizer (weight decay, grad norm) and checkpoints all ask this module.

"Counted once": a value or gradient that several ranks hold identical copies of must
enter a global sum (grad norm) or a checkpoint from one rank only. TP-replicated
parameters count on TP rank 0; the tied word embedding, held by the first and the last
pipeline stage, counts on the first.
"""
import dataclasses
from dataclasses import dataclass

# the record's slot on the nn.Parameter; only this module touches it
_SLOT = "_megatron_param_meta"


@dataclass(frozen=True)
class ParamMeta:
    """Per-parameter facts; change them with the set_* functions, never in place."""

    init_key: str | None = None        # layout-free name: seeds the init, keys the checkpoint
    init_method: str = "normal"        # 'normal' (init_std), 'zeros' or 'ones'
    init_std: float | None = None
    tensor_parallel: bool = False      # split over TP: every TP rank holds a different shard
    partition_dim: int | None = None   # the split dimension
    partition_stride: int = 1          # blocks along partition_dim split separately (SwiGLU [gate; up]: 2)
    unpadded_size: int | None = None   # rows along partition_dim holding real values; the rest is vocab padding
    sequence_parallel: bool = False    # TP-replicated, fed a sequence shard: its grad is summed over TP
    tied_embedding: bool = False       # the word embedding on the first and the last pipeline stage
    tied_output_copy: bool = False     # that table's copy the output layer uses (not counted, not saved)
    no_weight_decay: bool = False      # AdamW leaves it undecayed
    expert_parallel: bool = False      # one MoE expert's: held by one expert-parallel rank, reduced over expert-DP
    # where a layer that computes this parameter's weight gradient itself adds it (gradient-accumulation
    # fusion, wgrad_fusion.py): DDP, an object with grad_target(param) and grad_added(param); None:
    # the gradient goes through autograd (.grad). Not a fact of the model: not compared, not saved.
    grad_sink: object = dataclasses.field(default=None, compare=False, repr=False)
    embedding_or_output: bool = False  # the word embedding or the output layer's weight (--decoupled-lr)
    # Muon (optimizer/muon.py): False keeps a 2-D parameter on the scalar optimizer (a position table);
    # qkv_split: rows of Q, K and V in each query group of a fused QKV weight, orthogonalised apart
    use_muon: bool = True
    qkv_split: tuple[int, ...] | None = None


def _default(param):
    # Megatron-LM's decay rule: 1-D parameters (biases, norm weights) are not decayed
    return ParamMeta(no_weight_decay=param.ndim <= 1)


def param_meta(param) -> ParamMeta:
    """The record of `param` (a default, replicated one for a parameter no layer marked)."""
    meta = param.__dict__.get(_SLOT)
    return meta if meta is not None else _default(param)


def _update(param, **changes):
    param.__dict__[_SLOT] = dataclasses.replace(param_meta(param), **changes)


def set_init(param, method, std=None):
    """method: 'normal' (std), 'zeros' or 'ones'."""
    _update(param, init_method=method, init_std=std)


def set_tensor_parallel(param, partition_dim, stride=1, unpadded_size=None):
    """Mark `param` as split over TP along partition_dim (`stride` blocks split separately).

    unpadded_size: rows along partition_dim that hold real values; the rest (vocab
    padding) is initialised to zero and not saved.
    """
    _update(param, tensor_parallel=True, partition_dim=partition_dim, partition_stride=stride,
            unpadded_size=unpadded_size)


def set_sequence_parallel(param, flag=True):
    """Replicated over TP but computed on this rank's sequence shard: finalize sums its grad over TP."""
    _update(param, sequence_parallel=bool(flag))


def set_tied_embedding(param, output_copy=False):
    """The word embedding held on both the first and the last pipeline stage (grads summed over groups.embd;
    in ZB-V's layout both copies are on rank 0 and summed there). output_copy: the output layer's copy."""
    _update(param, tied_embedding=True, tied_output_copy=output_copy)


def set_expert_parallel(param):
    """A parameter of one MoE expert: only its expert-parallel rank holds it; its gradient is summed
    over the expert-data-parallel group (groups.edp), not groups.dp."""
    _update(param, expert_parallel=True)


def set_grad_sink(param, sink):
    """Let layers add `param`'s weight gradient straight into `sink` (see ParamMeta.grad_sink); None: stop."""
    _update(param, grad_sink=sink)


def set_embedding_or_output(param):
    """The word embedding or the output layer's weight: --decoupled-lr / --decoupled-min-lr apply to it."""
    _update(param, embedding_or_output=True)


def set_not_muon(param):
    """A 2-D parameter that is not a hidden matrix (an embedding table): the scalar optimizer takes it."""
    _update(param, use_muon=False)


def set_qkv_split(param, rows):
    """A fused QKV weight: `rows` (Q, K, V) rows in each query group, which Muon orthogonalises apart."""
    _update(param, qkv_split=tuple(rows))


def is_muon_matrix(param) -> bool:
    """Whether --optimizer muon orthogonalises `param`'s update: a 2-D weight that is not the word
    embedding, the output layer or marked otherwise (Megatron-Core's rule, plus other embedding tables)."""
    meta = param_meta(param)
    return param.ndim == 2 and meta.use_muon and not meta.embedding_or_output


def tensor_parallel_group(param, groups):
    """The process group `param` is split over (tensor_parallel_split's): groups.etp for an expert's, else groups.tp."""
    return groups.etp if param_meta(param).expert_parallel else groups.tp


def is_embedding_or_output(param) -> bool:
    return param_meta(param).embedding_or_output


def is_expert_parallel(param) -> bool:
    return param_meta(param).expert_parallel


def data_parallel_replica(param, groups):
    """(this rank's index, the number, the process group) of the ranks holding the same copy of
    `param`: the expert-data-parallel group for an expert's parameter (each EP rank holds other
    experts), else the DP x CP ranks (groups.dp_cp: CP ranks hold the same parameters)."""
    if param_meta(param).expert_parallel:
        return groups.edp_rank, groups.edp_size, groups.edp
    return groups.dp_cp_rank, groups.layout.dp_cp, groups.dp_cp


def tensor_parallel_split(param, groups) -> tuple[int, int]:
    """(this rank's shard index, the number of shards) of a tensor-parallel `param`: over the expert-TP
    group for an expert's parameter (groups.etp: TP itself unless the experts are folded, parallel_state),
    else over TP. Used by initialisation and checkpoints."""
    if param_meta(param).expert_parallel:
        return groups.etp_rank, groups.etp_size
    return groups.tp_rank, groups.tp_size


def set_init_key(param, key):
    _update(param, init_key=key)


def is_tensor_parallel_duplicate(param, tp_rank) -> bool:
    """True where `param` is the same on every TP rank and this is not TP rank 0."""
    return not param_meta(param).tensor_parallel and tp_rank != 0


def is_pipeline_duplicate(param, pp_rank) -> bool:
    """True for the output layer's copy of the tied word embedding (the first stage's input copy owns it)."""
    meta = param_meta(param)
    return meta.tied_embedding and (pp_rank != 0 or meta.tied_output_copy)


def counted_once(param, groups) -> bool:
    """Whether this rank's copy of `param` enters the grad norm and the checkpoint.

    groups: the rank grid (reads tp_rank, pp_rank; no communication). DP replicas are
    the caller's concern: their copies are identical and are summed or written by rule
    of the (distributed) optimizer.
    """
    # an expert's copies over TP are over expert-TP (the folded grid has none at expert TP 1)
    tp_rank = groups.etp_rank if param_meta(param).expert_parallel else groups.tp_rank
    return not (is_tensor_parallel_duplicate(param, tp_rank) or is_pipeline_duplicate(param, groups.pp_rank))


def has_weight_decay(param) -> bool:
    return not param_meta(param).no_weight_decay
