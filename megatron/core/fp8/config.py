"""FP8 flags: Megatron-LM's names, defaults and meanings (its Transformer-Engine argument group). A base of
TransformerConfig (config.py), so the CLI is generated from these fields; check_fp8() refuses values that do
not fit, in one line. What is not built (mxfp8, FP8 through Transformer Engine, FP8 experts in some layouts)
training/config/unbuilt_flags.py refuses with the other features that are not built."""
import math
from dataclasses import dataclass

import torch

from ..config_fields import flag_namer, opt
from ..errors import ConfigError
from ..parallel_layout import expert_tensor_parallel
from .blockwise import TILE
from .formats import FP8_MAX, formats


@dataclass
class Fp8Config:
    fp8_format: str | None = opt(
        None, "Run the linear layers' GEMMs (QKV, projection, fc1, fc2; forward, input and weight gradients) in "
        "FP8 through torch._scaled_mm: e4m3 everywhere, or hybrid (e4m3 forward, e5m2 gradients). Master "
        "weights, optimizer, norms, softmax, embedding, output layer and loss keep their precision. Default off.",
        choices=["e4m3", "hybrid"])
    fp8_recipe: str = opt(
        "delayed", "FP8 scaling: delayed (amax history, scale updated after each step), tensorwise (amax of the "
        "tensor being cast), blockwise (1x128 activation tiles, 128x128 weight blocks), mxfp8 (not built).",
        choices=["tensorwise", "delayed", "mxfp8", "blockwise"], requires="fp8_format")
    fp8_margin: int = opt(0, "Scaling margin: scales are 2^margin below the one that maps the amax to the format's "
                          "largest value.", requires="fp8_format")
    fp8_amax_history_len: int = opt(1, "Steps of amax history per tensor (delayed scaling).", requires="fp8_format")
    fp8_amax_compute_algo: str = opt("most_recent", "The amax a delayed scale uses: the history's max or its most "
                                     "recent entry.", choices=["most_recent", "max"], requires="fp8_format")
    fp8_param_gather: bool = opt(
        False, "Gather the FP8 linears' weights over data parallelism as FP8 (one byte per element: half a bf16 "
        "gather): after each step every rank casts its shard of the weights to FP8 with the whole weight's scale, "
        "and the GEMMs read the gathered FP8 copy. Needs a sharded optimizer (--use-distributed-optimizer or "
        "--data-parallel-sharding-strategy optim_grads / optim_grads_params) and tensorwise or delayed scaling.",
        requires="fp8_format")
    fp8_output_layer: bool = opt(
        False, "Run the output layer's GEMMs in FP8 too (the tied word table's, or the output layer's own), with the "
        "transformer layers' recipe. Not a Megatron-LM flag (it keeps the output layer in the model's precision, "
        "as this project does by default): an opt-in addition.", requires="fp8_format")
    first_last_layers_bf16: bool = opt(False, "Run the first and last transformer layers' GEMMs in the model's "
                                       "precision instead of FP8.", requires="fp8_format")
    num_layers_at_start_in_bf16: int = opt(1, "With --first-last-layers-bf16: layers at the start kept out of FP8.",
                                           requires="first_last_layers_bf16")
    num_layers_at_end_in_bf16: int = opt(1, "With --first-last-layers-bf16: layers at the end kept out of FP8.",
                                         requires="first_last_layers_bf16")


def fp8_layer(cfg, layer_number) -> Fp8Config | None:
    """The FP8 settings for transformer layer `layer_number` (from 1), or None where it runs without FP8."""
    if cfg.fp8_format is None:
        return None
    if cfg.first_last_layers_bf16 and (layer_number <= cfg.num_layers_at_start_in_bf16
                                       or layer_number > cfg.num_layers - cfg.num_layers_at_end_in_bf16):
        return None
    return cfg


def output_layer_fp8(cfg):
    """The FP8 settings of the output layer's GEMMs (--fp8-output-layer), or None where it keeps the model's
    precision (the default, as Megatron-LM)."""
    return cfg if cfg.fp8_format is not None and cfg.fp8_output_layer else None


def _sharded_dims(cfg):
    """(what, size per rank, ranks splitting it) of every dimension TP (or expert TP) splits in an FP8 GEMM."""
    tp = cfg.tensor_model_parallel_size
    qkv = (cfg.num_attention_heads + 2 * cfg.num_query_groups) * cfg.kv_channels
    dims = [("the QKV output", qkv // tp, tp), ("the attention projection's input",
                                                cfg.num_attention_heads * cfg.kv_channels // tp, tp),
            ("--ffn-hidden-size", cfg.ffn_hidden_size // tp, tp)]
    if cfg.num_experts:
        etp = expert_tensor_parallel(tp, cfg.expert_tensor_parallel_size)
        dims.append(("each expert's FFN (--moe-ffn-hidden-size)", cfg.expert_ffn_hidden_size // etp, etp))
        if cfg.moe_shared_expert_intermediate_size:
            dims.append(("--moe-shared-expert-intermediate-size", cfg.moe_shared_expert_intermediate_size // tp, tp))
    if cfg.fp8_output_layer and cfg.vocab_size:
        dims.append(("the padded vocabulary (--make-vocab-size-divisible-by)", cfg.padded_vocab_size // tp, tp))
    return dims


def check_fp8(cfg) -> None:
    """ConfigError for FP8 settings that are not built or do not fit (reads cfg only)."""
    f = flag_namer(cfg)
    if cfg.fp8_format is None:
        return
    for name in ("fp8_margin", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{f(name)} must be >= 0, got {getattr(cfg, name)}")
    top = largest_margin(cfg.fp8_format)
    if cfg.fp8_margin > top:
        raise ConfigError(f"{f('fp8_margin')} must be in [0, {top}] with {f('fp8_format')} {cfg.fp8_format}, got "
                          f"{cfg.fp8_margin}: above it the largest value lands below the format's smallest normal "
                          "number and the scaled tensors underflow")
    per_stage = cfg.num_layers // cfg.pipeline_model_parallel_size
    for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
        if cfg.first_last_layers_bf16 and getattr(cfg, name) > per_stage:  # Megatron-LM's bound
            raise ConfigError(f"{f(name)} ({getattr(cfg, name)}) must be between 0 and the layers per pipeline "
                              f"stage ({per_stage})")
    if cfg.fp8_amax_history_len < 1:
        raise ConfigError(f"{f('fp8_amax_history_len')} must be >= 1, got {cfg.fp8_amax_history_len}")
    if cfg.fp8_recipe == "blockwise":
        _check_blockwise(cfg, f)


def largest_margin(fmt) -> int:
    """The largest --fp8-margin at which the amax still lands on a normal number of every format cast to."""
    return min(int(math.log2(FP8_MAX[d] / torch.finfo(d).tiny)) for d in formats(fmt))


def check_fp8_param_gather(cfg, shards_optimizer: bool) -> None:
    """ConfigError where --fp8-param-gather cannot run: with blockwise scaling (its per-block scales are not
    gathered), or without a sharded optimizer (nothing is gathered: Megatron-LM's rule). Without --fp8-format it
    has no weight to gather (the start-up line of flags without effect says so: training/config/no_effect_flags.py)."""
    if not cfg.fp8_param_gather or cfg.fp8_format is None:
        return
    f = flag_namer(cfg)
    if cfg.fp8_recipe == "blockwise":
        raise ConfigError(f"{f('fp8_param_gather')} with {f('fp8_recipe')} blockwise is not built here (the "
                          "128x128 block scales are not gathered); use tensorwise or delayed, or drop the flag")
    if not shards_optimizer:
        raise ConfigError(f"{f('fp8_param_gather')} changes how a sharded optimizer gathers the updated weights: "
                          f"it needs --use-distributed-optimizer; add it or drop {f('fp8_param_gather')}")


def _check_blockwise(cfg, f):
    """Blockwise tiles must be the one-process tensor's tiles on every rank: no tile across a TP (or expert TP)
    shard boundary. The tiles along the tokens need the layout (check_fp8_layout)."""
    for what, size, split in _sharded_dims(cfg):
        if split > 1 and size % TILE:
            raise ConfigError(f"{f('fp8_recipe')} blockwise needs {what} per rank splitting it ({size}, over {split}) "
                              f"to be a multiple of {TILE}; change the sizes or use tensorwise")


def check_fp8_layout(cfg, layout, micro_batch_size) -> None:
    """ConfigError where blockwise weight-gradient tiles, which run along the tokens, would not be one process's:
    a context-parallel chunk (seq / (2 CP) positions x the micro batch) must be whole tiles; MoE experts need each
    micro-batch's rows of an expert on one rank in one process's order (no CP; ParallelLayout.
    experts_hold_whole_micro_batches)."""
    if cfg.fp8_format is None or cfg.fp8_recipe != "blockwise":
        return
    f = flag_namer(cfg)
    cp = cfg.context_parallel_size
    if cfg.num_experts and (cp > 1 or not layout.experts_hold_whole_micro_batches):
        spread = f"{f('context_parallel_size')} {cp}" if cp > 1 else \
            f"{f('tensor_model_parallel_size')} {layout.tp} with {f('expert_tensor_parallel_size')} {layout.etp} " \
            f"and {f('expert_model_parallel_size')} {layout.ep}"
        raise ConfigError(f"{f('fp8_recipe')} blockwise experts need each micro-batch's tokens of an expert on one "
                          f"rank in order (the weight-gradient tiles run along them), which {spread} does not give; "
                          "use tensorwise or delayed")
    rows = cfg.seq_length // (2 * cp) * micro_batch_size
    if cp > 1 and rows % TILE:
        raise ConfigError(f"{f('fp8_recipe')} blockwise with {f('context_parallel_size')} {cp} needs each of the "
                          f"2 x CP sequence chunks ({cfg.seq_length // (2 * cp)} positions x --micro-batch-size "
                          f"{micro_batch_size} = {rows} tokens) to be a multiple of {TILE} (the weight-gradient "
                          "tiles run along the tokens); change --seq-length or --micro-batch-size, or use tensorwise")
