"""Checks of TransformerConfig (config.py): sizes positive, shapes that divide, the pipeline split
and the recompute flags. They only read the config and raise ConfigError naming the flags and the fix."""
from .config_fields import flag_namer, flag_of
from .errors import ConfigError
from .pipeline_parallel.split import layer_split
from .ranges import NON_NEGATIVE, POSITIVE, check_ranges
from .transformer.mla_config import check_mla
from .transformer.moe.moe_config import check_moe
from .transformer.mtp_config import check_mtp


def check_sizes(cfg) -> None:
    """ConfigError unless every size in cfg.SIZES is a positive integer (None: not given, fine)."""
    for name in cfg.SIZES:
        value = getattr(cfg, name)
        if value is not None and value < 1:
            flag = "--vocab-size" if name == "vocab_size" else flag_of(type(cfg), name)
            raise ConfigError(f"{flag} must be a positive integer, got {value}")


def recompute_defaults(cfg):
    """(method, layers) of full recompute: uniform chunks of 1 layer unless given."""
    n = cfg.recompute_num_layers
    return cfg.recompute_method or "uniform", 1 if n is None else n


def validate(cfg) -> None:
    """Check the (resolved) configuration; assigns nothing. Raises ConfigError."""
    f = flag_namer(cfg)
    tp = cfg.tensor_model_parallel_size
    check_sizes(cfg)
    check_moe(cfg)
    check_mla(cfg)
    check_mtp(cfg)
    check_ranges(cfg, {"init_method_std": NON_NEGATIVE, "norm_epsilon": POSITIVE, "rotary_base": POSITIVE}, f)
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ConfigError(f"{f('hidden_size')} ({cfg.hidden_size}) is not divisible by "
                          f"{f('num_attention_heads')} ({cfg.num_attention_heads}); pick a head count "
                          "that divides it")
    if cfg.num_attention_heads % tp:
        raise ConfigError(f"{f('num_attention_heads')} ({cfg.num_attention_heads}) is not divisible by "
                          f"{f('tensor_model_parallel_size')} ({tp}); each TP rank needs whole heads")
    if cfg.num_attention_heads % cfg.num_query_groups:
        raise ConfigError(f"{f('num_attention_heads')} ({cfg.num_attention_heads}) is not divisible by "
                          f"{f('num_query_groups')} ({cfg.num_query_groups})")
    if cfg.num_query_groups % tp:
        raise ConfigError(f"{f('num_query_groups')} ({cfg.num_query_groups}) is not divisible by "
                          f"{f('tensor_model_parallel_size')} ({tp}); use a multiple of TP query groups")
    if cfg.ffn_hidden_size % tp:
        raise ConfigError(f"{f('ffn_hidden_size')} ({cfg.ffn_hidden_size}) is not divisible by "
                          f"{f('tensor_model_parallel_size')} ({tp})")
    if cfg.seq_length > cfg.max_position_embeddings:
        raise ConfigError(f"{f('seq_length')} ({cfg.seq_length}) is larger than "
                          f"{f('max_position_embeddings')} ({cfg.max_position_embeddings}); raise "
                          f"{f('max_position_embeddings')} or shorten the sequence")
    if cfg.sequence_parallel and cfg.seq_length % tp:
        raise ConfigError(f"{f('seq_length')} ({cfg.seq_length}) must be divisible by "
                          f"{f('tensor_model_parallel_size')} ({tp}) with {f('sequence_parallel')}")
    if cfg.position_embedding_type == "rope" and cfg.kv_channels % 2:
        raise ConfigError(f"rotary embeddings need an even head size, got {cfg.kv_channels}")
    if not 0.0 < cfg.rotary_percent <= 1.0:
        raise ConfigError(f"{f('rotary_percent')} must be in (0, 1], got {cfg.rotary_percent}")
    if cfg.position_embedding_type == "rope" and (cfg.rotary_dim < 2 or cfg.rotary_dim % 2):
        raise ConfigError(f"{f('rotary_percent')} {cfg.rotary_percent} x {f('kv_channels')} {cfg.kv_channels} "
                          f"gives {cfg.rotary_dim} rotated dimensions; it must be even and at least 2")
    for name in ("hidden_dropout", "attention_dropout"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ConfigError(f"{f(name)} must be in [0, 1), got {getattr(cfg, name)}")
    _validate_recompute(cfg, f)
    check_tensor_sizes(cfg, f)
    _validate_pipeline(cfg)
    _validate_context_parallel(cfg, f)


# torch computes a tensor's storage in bytes as a signed 64-bit number; fp32 (the main parameters) is 4 bytes
_LARGEST_TENSOR = (2 ** 63 - 1) // 4


def check_tensor_sizes(cfg, f) -> None:
    """ConfigError for a weight no device could allocate (its storage size overflows): every linear layer's
    weight has the hidden size on one side and one of these widths on the other."""
    h = cfg.hidden_size
    widths = [("the QKV output", (cfg.num_attention_heads + 2 * cfg.num_query_groups) * cfg.kv_channels),
              (f('ffn_hidden_size'), 2 * cfg.ffn_hidden_size), ("the vocabulary", cfg.vocab_size or 0)]
    if cfg.num_experts:
        widths += [(f('moe_ffn_hidden_size'), 2 * cfg.expert_ffn_hidden_size),
                   (f('moe_shared_expert_intermediate_size'), 2 * (cfg.moe_shared_expert_intermediate_size or 0))]
    what, width = max(widths, key=lambda w: w[1])
    if h * width > _LARGEST_TENSOR:
        raise ConfigError(f"{f('hidden_size')} {h} x {what} ({width}) is {h * width:.3g} elements: no device can "
                          "allocate a weight that large (its storage size overflows 64 bits); shrink the sizes")


def _validate_context_parallel(cfg, f):
    """Context parallelism: a positive size; no attention dropout (the CP attention has none);
    a2a splits each TP rank's heads over CP."""
    cp, tp = cfg.context_parallel_size, cfg.tensor_model_parallel_size
    if cp < 1:
        raise ConfigError(f"{f('context_parallel_size')} must be a positive integer, got {cp}")
    if cp > 1 and cfg.attention_dropout > 0:
        raise ConfigError(f"{f('context_parallel_size')} {cp} has no attention dropout; give "
                          f"{f('attention_dropout')} 0")
    if cp > 1 and cfg.cp_comm_type == "a2a" and cfg.num_attention_heads % (cp * tp):
        raise ConfigError(f"{f('cp_comm_type')} a2a needs {f('num_attention_heads')} ({cfg.num_attention_heads}) "
                          f"divisible by {f('context_parallel_size')} x {f('tensor_model_parallel_size')} "
                          f"({cp} x {tp}); use p2p or all_gather, or change the sizes")


def _validate_pipeline(cfg) -> None:
    """Check the chunks per rank (V) and that the layers split exactly."""
    f = flag_namer(cfg)
    pp, k = cfg.pipeline_model_parallel_size, cfg.num_layers_per_virtual_pipeline_stage
    uneven = cfg.decoder_first_pipeline_num_layers is not None or cfg.decoder_last_pipeline_num_layers is not None
    if k is not None:
        if pp < 2:
            raise ConfigError(f"{f('num_layers_per_virtual_pipeline_stage')} needs "
                              f"{f('pipeline_model_parallel_size')} of at least 2")
        if uneven:
            raise ConfigError(f"{f('num_layers_per_virtual_pipeline_stage')} assumes an even split; with "
                              f"{f('decoder_first_pipeline_num_layers')} / {f('decoder_last_pipeline_num_layers')} "
                              f"give {f('virtual_pipeline_model_parallel_size')} instead")
        layer_split(cfg.num_layers, pp)  # the even split must exist (error names the flags)
        per_stage = cfg.num_layers // pp
        if per_stage % k:
            raise ConfigError(
                f"{f('num_layers')} ({cfg.num_layers}) / {f('pipeline_model_parallel_size')} ({pp}) = "
                f"{per_stage} layers per stage is not divisible by "
                f"{f('num_layers_per_virtual_pipeline_stage')} ({k})")
        v = per_stage // k
        if cfg.virtual_pipeline_model_parallel_size not in (None, v):
            raise ConfigError(f"{f('virtual_pipeline_model_parallel_size')} "
                              f"({cfg.virtual_pipeline_model_parallel_size}) disagrees with "
                              f"{f('num_layers_per_virtual_pipeline_stage')} ({k}), which gives {v}")
    vpp = cfg.virtual_pipeline_model_parallel_size
    if vpp is not None and vpp > 1 and pp < 2:
        raise ConfigError(f"{f('virtual_pipeline_model_parallel_size')} needs "
                          f"{f('pipeline_model_parallel_size')} of at least 2")
    layer_split(cfg.num_layers, pp, cfg.virtual_pipeline_model_parallel_size,
                cfg.decoder_first_pipeline_num_layers, cfg.decoder_last_pipeline_num_layers)


def _validate_recompute(cfg, f):
    """The recompute method and layer count go with full recompute and fit the layer count."""
    g, method, n = cfg.recompute_granularity, cfg.recompute_method, cfg.recompute_num_layers
    if g != "full" and (method is not None or n is not None):
        raise ConfigError(f"{f('recompute_method')} and {f('recompute_num_layers')} go with "
                          f"{f('recompute_granularity')} full (selective recomputes the attention core of "
                          "every layer)")
    if g == "full":
        method, n = recompute_defaults(cfg)
        low = 1 if method == "uniform" else 0
        if not low <= n <= cfg.num_layers:
            raise ConfigError(f"{f('recompute_num_layers')} ({n}) must be between {low} and "
                              f"{f('num_layers')} ({cfg.num_layers}) with {f('recompute_method')} {method}")
