"""The configuration is resolved once, then checked by code that assigns nothing.

    tokenizer = resolve(model_cfg, train_cfg, world_size)   # fills every derived value, once
    layout = validate(model_cfg, train_cfg, world_size)     # only checks; -> the ParallelLayout

resolve fills: the tokenizer type (NullTokenizer with --mock-data), the model's vocabulary (the
tokenizer's; the padded size is computed from it, TransformerConfig.padded_vocab_size), the
parameter dtype (--bf16 / --fp16), the model chunks per pipeline rank
(--num-layers-per-virtual-pipeline-stage), the full-recompute defaults and the global batch size
(micro batch x DP). Defaults that follow from sibling fields of one config (ffn and head sizes,
query groups, max positions) are filled when the config is made (TransformerConfig.__post_init__).
Sizes are checked positive before anything divides by them. Nothing here needs a process group.
"""
from ...core.config import ConfigError
from ...core.fp8.config import check_fp8_layout, check_fp8_param_gather
from ...core.fusions import check_config as check_fusions
from ...core.parallel_layout import ParallelLayout, data_parallel_size
from ...core.pipeline_parallel.schedule_flag import check_v_layout, schedule_for_flag
from ..checkpointing.load_args import apply_checkpoint_args, check_ckpt_format
from ..loop import batch_schedule
from ..tokenizer import build_tokenizer
from .logging_flags import check_logging
from .offload_flags import check_offload, check_optimizer_offload


def resolve(model_cfg, train_cfg, world_size, make_tokenizer=build_tokenizer):
    """Fill the derived values of both configs for `world_size` ranks. -> the tokenizer
    (make_tokenizer(train_cfg)). Raises ConfigError (or TokenizerError) for bad input."""
    apply_checkpoint_args(model_cfg, train_cfg)  # --use-checkpoint-args, before any derived value
    model_cfg.check_sizes()
    train_cfg.check_sizes()
    train_cfg.resolve_tokenizer_type()
    train_cfg.validate_tokenizer()  # the tokenizer flags must fit before the tokenizer is built
    tokenizer = make_tokenizer(train_cfg)
    model_cfg.resolve(vocab_size=tokenizer.vocab_size)
    model_cfg.params_dtype = train_cfg.params_dtype
    check_v_layout(model_cfg, train_cfg.pipeline_schedule)
    # a world that TP x PP does not divide is reported by validate(), after the model's own checks
    train_cfg.resolve(data_parallel_size(world_size, model_cfg.tensor_model_parallel_size,
                                         model_cfg.context_parallel_size, model_cfg.pipeline_model_parallel_size),
                      model_cfg.seq_length)
    return tokenizer


def parallel_layout(model_cfg, train_cfg, world_size) -> ParallelLayout:
    """The run's ParallelLayout for resolved configs on `world_size` ranks, with the pipeline schedule
    --pipeline-schedule names (schedule_for_flag, the one call). Raises ConfigError (ParallelConfigError
    for sizes that do not fit)."""
    schedule = schedule_for_flag(train_cfg.pipeline_schedule, model_cfg.pipeline_model_parallel_size,
                                 model_cfg.virtual_pipeline_model_parallel_size or 1)
    return ParallelLayout.from_config(model_cfg, world_size, schedule)


def validate(model_cfg, train_cfg, world_size) -> ParallelLayout:
    """Check the resolved configs (model, kernels, layout, training) for `world_size` ranks;
    assigns nothing. -> the ParallelLayout. Raises ConfigError naming the flags."""
    model_cfg.validate()
    check_fusions(model_cfg)
    layout = parallel_layout(model_cfg, train_cfg, world_size)
    pp, vpp, dp = layout.pp, layout.vpp, layout.dp
    train_cfg.validate(dp)
    check_fp8_param_gather(model_cfg, train_cfg.ddp_config().shards_optimizer)
    check_fp8_layout(model_cfg, layout, train_cfg.micro_batch_size)
    if model_cfg.context_parallel_size > 1 and train_cfg.reset_attention_mask:
        raise ConfigError("--reset-attention-mask needs --context-parallel-size 1 (no attention mask crosses "
                          "context-parallel ranks); drop one of them")
    check_ckpt_format(train_cfg)
    check_offload(model_cfg, train_cfg)
    check_optimizer_offload(train_cfg)
    check_logging(train_cfg, world_size)
    batch_schedule.check(train_cfg, model_cfg.seq_length, dp, (pp, vpp) if vpp else None)
    num_micro = train_cfg.global_batch_size // (train_cfg.micro_batch_size * dp)
    if vpp and num_micro % pp:
        raise ConfigError(
            f"the interleaved schedule ({vpp} model chunks per rank) needs the number of microbatches, "
            f"--global-batch-size ({train_cfg.global_batch_size}) / (--micro-batch-size "
            f"({train_cfg.micro_batch_size}) x data-parallel size ({dp})) = {num_micro}, to be a multiple "
            f"of --pipeline-model-parallel-size ({pp})")
    return layout
