"""Checks of TrainingConfig (config.py): sizes positive, the learning-rate schedule, precision, checkpoint
and data flags. They only read the config and raise ConfigError naming the flags and the fix."""
from ...core.checkpointing import same_dir
from ...core.config_fields import flag_namer
from ...core.datasets import DatasetError, parse_blend, parse_split
from ...core.errors import ConfigError
from ...core.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, check_ranges

# numeric flags outside these ranges fail in validate(); NaN and inf fail everywhere (ranges.py)
NUMBER_RULES = {
    "lr": NON_NEGATIVE, "min_lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "clip_grad": NON_NEGATIVE,
    "adam_beta1": FRACTION, "adam_beta2": FRACTION, "adam_eps": POSITIVE,
    "seed": ("[]", 0, 2 ** 31 - 1),  # numpy seeds (and seed + 1) must fit 32 bits
    "lr_warmup_iters": NON_NEGATIVE, "lr_decay_iters": AT_LEAST_ONE, "lr_wsd_decay_iters": AT_LEAST_ONE,
    "loss_scale": POSITIVE, "initial_loss_scale": POSITIVE, "min_loss_scale": POSITIVE,
    "eval_iters": NON_NEGATIVE, "exit_duration_in_mins": POSITIVE, "decoupled_lr": NON_NEGATIVE,
    "decoupled_min_lr": NON_NEGATIVE, "tiktoken_num_special_tokens": NON_NEGATIVE,
}


def check_sizes(cfg) -> None:
    """ConfigError unless the counts something divides by or loops over are positive."""
    f = flag_namer(cfg)
    for name in ("micro_batch_size", "global_batch_size", "train_iters", "train_samples", "log_interval",
                 "eval_interval", "distributed_timeout_minutes", "inference_max_seq_length"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise ConfigError(f"{f(name)} must be at least 1, got {getattr(cfg, name)}")


def check_schedule(cfg) -> None:
    """The learning-rate and length flags fit together (Megatron-LM's rules): --lr is given; training
    counts iterations or samples, and the schedule flags count the same."""
    if cfg.lr is None:
        raise ConfigError("--lr is required (the peak learning rate; Megatron-LM has no default either), "
                          "e.g. --lr 3e-4")
    if cfg.train_samples is not None:
        resolved = cfg.train_iters_derived or (cfg.global_batch_size and
                                               cfg.train_iters == cfg.train_samples // cfg.global_batch_size)
        if cfg.train_iters is not None and not resolved:
            raise ConfigError("give --train-iters or --train-samples, not both")
        given = [f for f, v in (("--lr-decay-iters", cfg.lr_decay_iters), ("--lr-warmup-iters",
                 cfg.lr_warmup_iters or None), ("--lr-wsd-decay-iters", cfg.lr_wsd_decay_iters)) if v is not None]
        unit, warmup = "samples", cfg.lr_warmup_samples
    elif cfg.train_iters is not None:
        given = [f for f, v in (("--lr-decay-samples", cfg.lr_decay_samples), ("--lr-warmup-samples",
                 cfg.lr_warmup_samples or None), ("--lr-wsd-decay-samples", cfg.lr_wsd_decay_samples))
                 if v is not None]
        unit, warmup = "iters", cfg.lr_warmup_iters
    else:
        raise ConfigError("give the training length: --train-iters N or --train-samples N")
    if given:
        other = "iterations (--train-iters)" if unit == "iters" else "samples (--train-samples)"
        raise ConfigError(f"{', '.join(given)} do not fit training measured in {other}; use the "
                          f"--lr-*-{unit} flags")
    if cfg.lr_warmup_fraction is not None and warmup:
        raise ConfigError(f"give --lr-warmup-fraction or --lr-warmup-{unit}, not both")


def validate(cfg, dp_size: int) -> None:
    """Check the resolved configuration for a data-parallel size; assigns nothing."""
    f = flag_namer(cfg)
    check_sizes(cfg)
    check_ranges(cfg, NUMBER_RULES, f)
    _validate_schedule(cfg, f)
    if cfg.global_batch_size is None:
        raise ConfigError(f"{f('global_batch_size')} is not set: resolve the configuration first")
    if cfg.global_batch_size % (cfg.micro_batch_size * dp_size):
        raise ConfigError(
            f"{f('global_batch_size')} ({cfg.global_batch_size}) is not divisible by "
            f"{f('micro_batch_size')} ({cfg.micro_batch_size}) x data-parallel size ({dp_size}) = "
            f"{cfg.micro_batch_size * dp_size}; use a multiple of it")
    check_schedule(cfg)
    if cfg.lr < 0 or cfg.min_lr < 0 or cfg.min_lr > cfg.lr:
        raise ConfigError(f"need 0 <= {f('min_lr')} ({cfg.min_lr}) <= {f('lr')} ({cfg.lr})")
    if cfg.clip_grad < 0 or cfg.weight_decay < 0 or cfg.eval_iters < 0:
        raise ConfigError(f"{f('clip_grad')}, {f('weight_decay')} and {f('eval_iters')} must be non-negative")
    if cfg.lr_warmup_fraction is not None and not 0 <= cfg.lr_warmup_fraction <= 1:
        raise ConfigError(f"{f('lr_warmup_fraction')} must be in [0, 1], got {cfg.lr_warmup_fraction}")
    if cfg.exit_interval is not None and cfg.exit_interval < 1:
        raise ConfigError(f"{f('exit_interval')} must be at least 1")
    _validate_schedule_values(cfg)
    if cfg.bf16 and cfg.fp16:
        raise ConfigError("--bf16 and --fp16 are exclusive; pick one")
    if cfg.grad_reduce_in_bf16 and not cfg.bf16:
        raise ConfigError("--grad-reduce-in-bf16 needs --bf16")
    if not 0.0 <= cfg.optimizer_offload_fraction <= 1.0:
        raise ConfigError(f"--optimizer-offload-fraction must be in [0, 1], got {cfg.optimizer_offload_fraction}")
    if cfg.optimizer_offload_fraction != 1.0 and not cfg.optimizer_cpu_offload:
        raise ConfigError(f"--optimizer-offload-fraction {cfg.optimizer_offload_fraction} goes with "
                          "--optimizer-cpu-offload (without it nothing is offloaded); add it or drop the fraction")
    if cfg.overlap_param_gather and not cfg.ddp_config().shards_optimizer:
        raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer")
    if cfg.hysteresis < 1 or cfg.loss_scale_window < 1 or (cfg.loss_scale is not None and cfg.loss_scale <= 0):
        raise ConfigError("--hysteresis and --loss-scale-window must be at least 1, --loss-scale positive")
    if cfg.save_interval is not None and cfg.save_interval < 1:
        raise ConfigError("--save-interval must be at least 1")
    if cfg.save_interval and not cfg.save:
        raise ConfigError("--save-interval needs --save DIR")
    _validate_finetune(cfg)
    if cfg.distributed_timeout_minutes < 1:
        raise ConfigError(f"{f('distributed_timeout_minutes')} must be at least 1, "
                          f"got {cfg.distributed_timeout_minutes}")
    if cfg.ddp_bucket_size is not None and cfg.ddp_bucket_size < 1:
        raise ConfigError("--ddp-bucket-size must be at least 1")
    _validate_data(cfg)


def _validate_finetune(cfg):
    """--finetune saving into its own --load directory would make the finetune's checkpoints that
    directory's latest: the pretraining command would then resume from them and overwrite its own."""
    if cfg.use_checkpoint_args and not (cfg.load or cfg.pretrained_checkpoint):
        raise ConfigError("--use-checkpoint-args takes the architecture from a checkpoint: give --load DIR (or "
                          "--pretrained-checkpoint DIR), as Megatron-LM requires")
    if cfg.finetune and same_dir(cfg.load, cfg.save):
        raise ConfigError(f"--finetune with --save the same directory as --load ({cfg.load}): the finetune's "
                          "checkpoints would become the pretraining run's latest; give another --save (to resume "
                          f"the finetune later: --load that directory --pretrained-checkpoint {cfg.load})")


def _validate_schedule(cfg, f):
    """The warm-up and decay lengths fit inside each other; the loss-scale floor below its start."""
    decay = cfg.lr_decay_iters or cfg.train_iters
    if cfg.lr_wsd_decay_iters is not None and cfg.lr_wsd_decay_iters > decay:
        raise ConfigError(f"{f('lr_wsd_decay_iters')} ({cfg.lr_wsd_decay_iters}) is longer than the decay "
                          f"({f('lr_decay_iters')} or {f('train_iters')}: {decay}); shorten it")
    if cfg.fp16 and cfg.loss_scale is None and cfg.min_loss_scale > cfg.initial_loss_scale:
        raise ConfigError(f"{f('min_loss_scale')} ({cfg.min_loss_scale}) is above {f('initial_loss_scale')} "
                          f"({cfg.initial_loss_scale}); lower it")


def _validate_schedule_values(cfg):
    """Signs and ranges of the learning-rate schedule's own numbers."""
    f = flag_namer(cfg)
    for name in ("lr_decay_iters", "lr_decay_samples", "lr_wsd_decay_iters", "lr_wsd_decay_samples"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise ConfigError(f"{f(name)} must be at least 1, got {getattr(cfg, name)}")
    for name in ("lr_warmup_iters", "lr_warmup_samples"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{f(name)} must be non-negative, got {getattr(cfg, name)}")
    if not 0 <= cfg.lr_warmup_init <= cfg.lr:
        raise ConfigError(f"need 0 <= --lr-warmup-init ({cfg.lr_warmup_init}) <= --lr ({cfg.lr})")
    if cfg.exit_duration_in_mins is not None and cfg.exit_duration_in_mins <= 0:
        raise ConfigError(f"--exit-duration-in-mins must be positive, got {cfg.exit_duration_in_mins}")


def _validate_data(cfg):
    """The data flags fit together: one source of data, parsable splits and blends, the tokenizer."""
    per_split = any(cfg.per_split_paths)
    if cfg.mock_data and (cfg.data_path or per_split):
        raise ConfigError("--mock-data and --data-path (or --train-data-path ...) exclude each other")
    if cfg.data_path and per_split:
        raise ConfigError("give either --data-path (split by --split) or --train-data-path / "
                          "--valid-data-path / --test-data-path, not both")
    if per_split and not cfg.train_data_path:
        raise ConfigError("--valid-data-path / --test-data-path need --train-data-path as well")
    if per_split and cfg.eval_iters > 0 and not cfg.valid_data_path:
        raise ConfigError(f"--eval-iters {cfg.eval_iters} needs validation data: give --valid-data-path, "
                          "or set --eval-iters 0")
    try:
        parse_split(cfg.split)
        for flag, paths in (("--data-path", cfg.data_path), ("--train-data-path", cfg.train_data_path),
                            ("--valid-data-path", cfg.valid_data_path), ("--test-data-path", cfg.test_data_path)):
            parse_blend(paths, flag)
    except DatasetError as e:
        raise ConfigError(str(e)) from None
    validate_tokenizer(cfg)


def validate_tokenizer(cfg) -> None:
    """The tokenizer flags fit together (checked before the tokenizer is built)."""
    if not (cfg.mock_data or cfg.data_path or any(cfg.per_split_paths)):
        raise ConfigError("no training data: give --data-path (or --train-data-path ...) or --mock-data")
    tok = cfg.tokenizer_type
    if tok is None:
        raise ConfigError("--data-path needs --tokenizer-type (and its files): the tokenizer that "
                          "tools/preprocess_data.py used")
    if tok == "NullTokenizer" and (cfg.null_vocab_size is None or cfg.null_vocab_size < 1):
        raise ConfigError("--tokenizer-type NullTokenizer needs --vocab-size N (N >= 1)")
    # HuggingFaceTokenizer: Megatron-LM's recipes give --vocab-size beside it and Megatron-LM ignores it
    # (the tokenizer's vocabulary is the model's); the start-up line says so (no_effect_flags.py)
    if tok not in ("NullTokenizer", "TikTokenizer", "HuggingFaceTokenizer") and cfg.null_vocab_size is not None:
        raise ConfigError(f"--vocab-size goes with --tokenizer-type NullTokenizer (or TikTokenizer), not {tok} "
                          "(whose files define the vocabulary)")
