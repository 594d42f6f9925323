"""FP8 (core/fp8) on paper: what --fp8-format changes in a layer's step time (cost.layer_costs).

The FP8 linears (standard attention's QKV and projection, the MLP's fc1 and fc2, the experts; not the router,
the attention core or multi-latent attention's projections) run their forward, input-gradient and
weight-gradient GEMMs at the GPU's FP8 peak, with the bf16 GEMM efficiency curve of their shape (no FP8 curve
is calibrated: an assumption), in the layers --first-last-layers-bf16 leaves in FP8. Around each GEMM the
recipe casts its operands (bytes streamed through HBM, elt the activation bytes):
    tensorwise  an amax pass and a cast of x, W (forward) and g (backward): (2 elt + 1) per element; W cast
                again in the backward (elt + 1); the FP8 x and g transposed for the weight gradient (1 + 1)
    delayed     the same without the amax passes (the scale is the history's): elt + 1 per cast
    blockwise   the casts without the amax passes (per tile), x and g cast again along the other dimension
                for the weight gradient instead of the transposes
With --fp8-output-layer the output layer's GEMM (cost.head_costs) gains the same way, with its casts.
On a GPU without FP8 tensor cores (no peak_fp8_tflops in calibration.toml) nothing is faster.
"""
from ...core.fp8.config import output_layer_fp8
from .fp8_memory import fp8_layers
from .hardware import Cluster, memory_time
from .traffic import element_bytes


def fp8_share(c, cluster: Cluster) -> float:
    """The fraction of the model's layers whose linears run in FP8 on this cluster (0 without FP8)."""
    if c.fp8_format is None or cluster.peak_fp8_flops is None:
        return 0.0
    return fp8_layers(c) / c.num_layers


def linear_shapes(c, m, tp, moe) -> list:
    """(M, N, K) of one layer's FP8 linears on one rank for m tokens (this CP rank's), forward y [M, N] =
    x [M, K] W [N, K]^T; moe: the MoE layers' share (experts: T k rows over the local experts' weights)."""
    h, f = c.hidden_size, c.ffn_hidden_size
    shapes = []
    if not c.multi_latent_attention:
        q, kv = c.num_attention_heads * c.kv_channels, c.num_query_groups * c.kv_channels
        shapes += [(m, (q + 2 * kv) / tp, h), (m, h, q / tp)]
    mats = 2 if c.swiglu else 1
    dense = [(m, mats * f / tp, h), (m, h, f / tp)]
    shapes += [(M, N * (1 - moe), K) for M, N, K in dense]
    if moe:
        fe, local = c.expert_ffn_hidden_size, c.num_experts // c.expert_model_parallel_size
        rows = m * c.moe_router_topk  # spread over the local experts; their weights add up
        shapes += [(rows, moe * local * mats * fe / tp, h), (rows, moe * local * h, fe / tp)]
    return shapes


def cast_bytes(c, shapes) -> tuple[float, float]:
    """(forward, backward) bytes the recipe's casts stream for these GEMMs (module docstring)."""
    elt = element_bytes(c)
    amax = elt if c.fp8_recipe == "tensorwise" else 0
    fwd = bwd = 0.0
    for M, N, K in shapes:
        fwd += (elt + amax + 1) * (M * K + N * K)
        bwd += (elt + amax + 1) * M * N + (elt + 1) * N * K
        bwd += (elt + 1) * (M * K + M * N) if c.fp8_recipe == "blockwise" else 2 * (M * K + M * N)
    return fwd, bwd


def fp8_savings(c, m, cluster: Cluster, tp, eligible_gemms, moe) -> tuple[float, float]:
    """(forward, backward) seconds FP8 takes off one layer: eligible_gemms, the seconds of the FP8 linears'
    forward GEMMs in bf16, run at the FP8 peak (backward: twice them), less the casts' streaming."""
    share = fp8_share(c, cluster)
    if not share:
        return 0.0, 0.0
    faster = eligible_gemms * (1 - cluster.peak_flops / cluster.peak_fp8_flops)
    fwd_bytes, bwd_bytes = cast_bytes(c, linear_shapes(c, m, tp, moe))
    return (share * (faster - memory_time(cluster, fwd_bytes)),
            share * (2 * faster - memory_time(cluster, bwd_bytes)))


def head_fp8_savings(c, m, cluster: Cluster, tp, gemm) -> tuple[float, float]:
    """(forward, backward) seconds --fp8-output-layer takes off the output layer for m tokens: its forward GEMM
    (gemm seconds in bf16, x [m, h] by the vocabulary's slice [v/tp, h]) at the FP8 peak (backward: twice it),
    less its casts' streaming. Zero without the flag, as for layers on a GPU without FP8."""
    if output_layer_fp8(c) is None or cluster.peak_fp8_flops is None:
        return 0.0, 0.0
    faster = gemm * (1 - cluster.peak_flops / cluster.peak_fp8_flops)
    fwd_bytes, bwd_bytes = cast_bytes(c, [(m, c.padded_vocab_size / tp, c.hidden_size)])
    return faster - memory_time(cluster, fwd_bytes), 2 * faster - memory_time(cluster, bwd_bytes)
