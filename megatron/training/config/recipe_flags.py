"""Training flags of Megatron-LM's recipes beyond the core ones (issue 31): Megatron-LM's names, defaults
and meanings. A base of TrainingConfig (config.py), so the CLI is generated from these fields.

What implements them: batch_schedule.py (--step-batch-size-schedule, --rampup-batch-size),
optimizer_setup.build_scheduler (--decoupled-lr), runtime_switches.py (--manual-gc, --empty-unused-memory-level),
data.py (--no-mmap-bin-files), checkpointing.py (--dist-ckpt-strictness). Those that change nothing here
are listed with the reason at start-up (no_effect_flags.py).
"""
import dataclasses
from dataclasses import dataclass

from ...core.config_fields import flag_namer, opt
from ...core.errors import ConfigError

STRICTNESS = ["assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all",
              "return_unexpected", "return_all", "ignore_all"]


@dataclass
class RunOptions:
    step_batch_size_schedule: str | None = opt(
        None, "Global batch size by samples consumed: 'THRESHOLD:BS THRESHOLD:BS ...', thresholds in tokens "
        "(divided by --seq-length; suffixes K, M, B, T), the first 0, e.g. '0:16 2.4B:320 12B:1536'. The "
        "learning-rate schedule advances by each iteration's batch.")
    rampup_batch_size: list[int] | None = opt(
        None, "START INCREMENT SAMPLES: Megatron-LM's older batch ramp (from START, +INCREMENT at even steps over "
        "SAMPLES samples, then --global-batch-size); needs --train-samples.", nargs=3)
    decoupled_lr: float | None = opt(
        None, "Peak learning rate of the word embedding and the output layer (default --lr).")
    decoupled_min_lr: float | None = opt(
        None, "Final learning rate of the word embedding and the output layer (default --min-lr).")
    manual_gc: bool = opt(False, "Turn Python's automatic garbage collector off and collect at fixed points "
                          "(every --manual-gc-interval iterations, around evaluations), the same on every rank.")
    manual_gc_interval: int = opt(0, "With --manual-gc, collect every this many iterations (0: never in training).",
                                  requires="manual_gc")
    manual_gc_eval: bool = opt(True, "With --manual-gc, do not collect around evaluations.",
                               flag="--no-manual-gc-eval", requires="manual_gc")
    empty_unused_memory_level: int = opt(
        0, "Release the CUDA caching allocator's unused blocks (torch.cuda.empty_cache): 1 after each "
        "forward-backward and evaluation step, 2 also after the optimizer step.", choices=[0, 1, 2])
    num_workers: int = opt(2, "Megatron-LM's data-loader worker processes. Accepted: batches are read in the "
                           "training process here (the same samples either way).")
    mmap_bin_files: bool = opt(True, "Read the .bin token files with file reads instead of memory-mapping them.",
                               flag="--no-mmap-bin-files")
    create_attention_mask_in_dataloader: bool = opt(
        True, "Do not build attention masks with the batches (only --reset-attention-mask needs one here; the "
        "causal mask is never materialised).", flag="--no-create-attention-mask-in-dataloader")
    dist_ckpt_strictness: str = opt(
        "assume_ok_unexpected", "Loading a checkpoint whose tensors differ from the model's: a model tensor the "
        "checkpoint lacks fails the load (assume_ok_unexpected, raise_*) or keeps its initial value with a "
        "warning (log_*, return_*, ignore_all); a checkpoint tensor the model lacks is ignored, warned about "
        "(log_all) or fails the load (raise_all).", choices=STRICTNESS)
    accumulate_allreduce_grads_in_fp32: bool = opt(
        False, "Accumulate and reduce gradients in fp32: what happens here already unless --grad-reduce-in-bf16 "
        "(which wins, as in Megatron-LM).")
    nccl_ub: bool = opt(False, "NCCL user-buffer registration of the data-parallel buffers (a GPU speed switch "
                        "not built here: accepted, no effect).", flag="--use-nccl-ub")
    enable_experimental: bool = opt(False, "Megatron-LM's switch for its experimental code paths; none is gated by "
                                    "it here: accepted, no effect.")
    yaml_cfg: str | None = opt(
        None, "A YAML file of these options (keys: the options' names with underscores, in groups if wanted, as "
        "Megatron-LM's language_model: and model_parallel:); flags on the command line override it "
        "(docs/yaml_config.md).")
    # set by resolve() when --train-iters was derived from --train-samples (resolving twice keeps it)
    train_iters_derived: bool = dataclasses.field(default=False, metadata={"cli": False})


def check_run_options(cfg) -> None:
    """ConfigError for values that do not fit (reads cfg only)."""
    f = flag_namer(cfg)
    if cfg.manual_gc_interval < 0:
        raise ConfigError(f"{f('manual_gc_interval')} must be non-negative, got {cfg.manual_gc_interval}")
    if cfg.num_workers < 0:
        raise ConfigError(f"{f('num_workers')} must be non-negative, got {cfg.num_workers}")
    for name in ("decoupled_lr", "decoupled_min_lr"):
        if getattr(cfg, name) is not None and not getattr(cfg, name) >= 0:
            raise ConfigError(f"{f(name)} must be non-negative, got {getattr(cfg, name)}")
    if cfg.decoupled_min_lr is not None and cfg.decoupled_lr is None:
        raise ConfigError(f"{f('decoupled_min_lr')} goes with {f('decoupled_lr')}")
    final = cfg.min_lr if cfg.decoupled_min_lr is None else cfg.decoupled_min_lr
    if cfg.decoupled_lr is not None and final > cfg.decoupled_lr:
        raise ConfigError(f"the embedding and output layer's final learning rate ({final}) is above "
                          f"{f('decoupled_lr')} ({cfg.decoupled_lr}); lower it")
    if not cfg.create_attention_mask_in_dataloader and cfg.reset_attention_mask:
        raise ConfigError(f"--reset-attention-mask needs the attention mask the batches carry; drop "
                          f"{f('create_attention_mask_in_dataloader')} (Megatron-LM would drop the reset silently)")
