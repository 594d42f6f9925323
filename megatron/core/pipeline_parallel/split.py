"""Which transformer layers each pipeline rank and model chunk holds.

Layers are numbered over the whole model in the order data flows through the virtual
stages: virtual stage s = chunk * P + pp_rank holds the s-th run of layers. With V = 1
this is one contiguous run per rank; with V > 1 (interleaved schedule) rank p holds
chunks p, P + p, 2P + p, ... Example, 8 layers, P = 2, V = 2 (layers counted from 0):

    rank 0: chunk 0 -> layers 0-1, chunk 1 -> layers 4-5
    rank 1: chunk 0 -> layers 2-3, chunk 1 -> layers 6-7

ZB-V (--pipeline-schedule zb-v, ParallelLayout.v_shape) has 2P equal stages in a V instead:
rank p holds stage p as chunk 0 and stage 2P - 1 - p as chunk 1 (v_layer_split).

Uneven splits: the first and/or last stage may get their own layer count
(--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers, as in
Megatron-LM); the other stages share the rest evenly. Every stage's count must divide
into its V chunks. Nothing is ever rounded: a split that does not divide is an error.
"""

from ..errors import ConfigError

_FIRST, _LAST = "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"
_P, _V = "--pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank"


def stage_layer_counts(num_layers: int, pp: int, first: int | None = None,
                       last: int | None = None) -> list[int]:
    """Layers per pipeline stage (all its chunks together). Raises ConfigError."""
    if pp == 1:
        if first is not None or last is not None:
            raise ConfigError(f"{_FIRST} / {_LAST} need {_P} of at least 2")
        return [num_layers]
    for flag, n in ((_FIRST, first), (_LAST, last)):
        if n is not None and n < 1:
            raise ConfigError(f"{flag} must be at least 1, got {n}")
    fixed = {i: n for i, n in ((0, first), (pp - 1, last)) if n is not None}
    rest_layers = num_layers - sum(fixed.values())
    rest_stages = pp - len(fixed)
    if not fixed:
        if num_layers % pp:
            raise ConfigError(
                f"--num-layers ({num_layers}) is not divisible by {_P} ({pp}); use a multiple of {pp} "
                f"layers, or give the first/last stage its own count with {_FIRST} / {_LAST}")
        return [num_layers // pp] * pp
    given = " + ".join(f"{f} ({n})" for f, n in ((_FIRST, first), (_LAST, last)) if n is not None)
    if rest_stages == 0:
        if rest_layers != 0:
            raise ConfigError(f"{given} must add up to --num-layers ({num_layers}) with {_P} {pp}")
        return [first, last]
    if rest_layers < rest_stages or rest_layers % rest_stages:
        raise ConfigError(
            f"--num-layers ({num_layers}) minus {given} leaves {rest_layers} layers, which do not divide "
            f"evenly over the other {rest_stages} pipeline stage(s) (each needs at least one)")
    counts = [rest_layers // rest_stages] * pp
    for i, n in fixed.items():
        counts[i] = n
    return counts


def layer_split(num_layers: int, pp: int, vpp: int | None = None, first: int | None = None,
                last: int | None = None) -> list[list[tuple[int, int]]]:
    """[pp_rank][chunk] -> (layer_offset, num_layers) with offsets counted from 0 over the model.

    Raises ConfigError (naming the flags) when the layers do not divide.
    """
    v = vpp or 1
    counts = stage_layer_counts(num_layers, pp, first, last)
    for p, n in enumerate(counts):
        if n % v:
            raise ConfigError(
                f"pipeline stage {p} has {n} layers, which do not divide into {v} model chunks "
                f"({_V} {v}); change --num-layers, {_V}, or the per-stage counts")
    split = [[None] * v for _ in range(pp)]
    offset = 0
    for chunk in range(v):
        for p in range(pp):
            n = counts[p] // v
            split[p][chunk] = (offset, n)
            offset += n
    return split


def v_layer_split(num_layers: int, pp: int) -> list[list[tuple[int, int]]]:
    """ZB-V's layout: [pp_rank][chunk] -> (layer_offset, num_layers) with 2P stages of equal size, rank p
    holding stage p (chunk 0) and stage 2P - 1 - p (chunk 1). Raises ConfigError naming the flags."""
    if num_layers % (2 * pp):
        raise ConfigError(f"--pipeline-schedule zb-v needs --num-layers ({num_layers}) divisible by 2 x {_P} "
                          f"({2 * pp}): each rank holds two equal stages")
    n = num_layers // (2 * pp)
    return [[(p * n, n), ((2 * pp - 1 - p) * n, n)] for p in range(pp)]


def chunk_roles(layout, pp_rank: int, chunk: int) -> tuple[bool, bool]:
    """(pre_process, post_process) of one model chunk of `layout` (ParallelLayout): the embedding on the
    first virtual stage, the output layer and loss on the last; in the V layout both are on rank 0
    (chunks 0 and 1)."""
    if layout.v_shape:
        return pp_rank == 0 and chunk == 0, pp_rank == 0 and chunk == 1
    return pp_rank == 0 and chunk == 0, pp_rank == layout.pp - 1 and chunk == layout.chunks - 1


def stage_layers(config, layout, pp_rank: int, vp_stage: int | None = None) -> tuple[int, int]:
    """(layer_offset, num_layers) of one model chunk, from a TransformerConfig and its ParallelLayout."""
    if layout.v_shape:
        return v_layer_split(config.num_layers, layout.pp)[pp_rank][vp_stage or 0]
    split = layer_split(config.num_layers, layout.pp, layout.vpp, config.decoder_first_pipeline_num_layers,
                        config.decoder_last_pipeline_num_layers)
    return split[pp_rank][vp_stage or 0]
