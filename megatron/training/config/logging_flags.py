"""Logging, timing, W&B and profiler options, with Megatron-LM's names, defaults and meanings (its
LoggerConfig and ProfilingConfig), and their checks. TrainingConfig inherits them.

What each does at run time: log.py (the iteration line), scalar_writers.py (TensorBoard and W&B),
core/timers.py (the per-phase timers), profiling.py (--profile), step_stats.py (params norm, zeros).
"""
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass

import torch

from ...core.config import ConfigError, opt
from ...core.config_fields import flag_namer
from ...core.ranges import NON_NEGATIVE, check_ranges
from ...core.timers import LEVELS, OPTIONS


@dataclass
class LoggingOptions:
    log_throughput: bool = opt(False, "Show the throughput per GPU (TFLOP/s/GPU; and MFU on a GPU of the peak "
                               "table, docs/mfu.md) in the iteration line; with --log-timers-to-tensorboard also in "
                               "TensorBoard.")
    log_params_norm: bool = opt(False, "Compute the L2 norm of the (fp32 main) parameters after every step and "
                                "log it (iteration line, TensorBoard params-norm).")
    log_num_zeros_in_grad: bool = opt(False, "Count the zeros in every step's gradients over the whole model and "
                                      "log them (iteration line, TensorBoard num-zeros).")
    timing_log_level: int = opt(
        0, "Timers to report at each log interval: 0 none (no cost), 1 the phases run once per iteration "
        "(forward-backward, gradient reductions, optimizer and its parts; each synchronises the device, and waits "
        "for every rank unless --no-barrier-with-level-1-timing), 2 also per microbatch (batch generation, "
        "forward and backward compute, pipeline sends and receives).", choices=list(LEVELS))
    timing_log_option: str = opt("minmax", "How timers are reported over the ranks: the max, the min and max, or "
                                 "every rank's.", choices=list(OPTIONS), requires=("timing_log_level", (1, 2)))
    barrier_with_l1_time: bool = opt(True, "Do not wait for every rank at the start of a level-1 timer.",
                                     flag="--no-barrier-with-level-1-timing", requires=("timing_log_level", (1, 2)))
    tensorboard_log_interval: int = opt(1, "Write each iteration's scalars (losses, learning rate, grad norm, ...) "
                                        "to TensorBoard and W&B every this many iterations.",
                                        requires=["tensorboard_dir", "wandb_project"])
    tensorboard_queue_size: int = opt(1000, "TensorBoard events held in memory before a write to disk.",
                                      requires="tensorboard_dir")
    log_timers_to_tensorboard: bool = opt(False, "Write the iteration time, the timers (NAME-time, the max over "
                                          "ranks) and, with --log-throughput, the throughput to TensorBoard.",
                                          requires=["tensorboard_dir", "wandb_project"])
    log_loss_scale_to_tensorboard: bool = opt(True, "Do not write the loss scale to TensorBoard.",
                                              flag="--no-log-loss-scale-to-tensorboard",
                                              requires=["tensorboard_dir", "wandb_project"])
    log_validation_ppl_to_tensorboard: bool = opt(False, "Write the validation perplexity to TensorBoard.",
                                                  requires=["tensorboard_dir", "wandb_project"])
    log_memory_to_tensorboard: bool = opt(
        False, "Write the last rank's memory to TensorBoard: CUDA allocator statistics (mem-reserved-bytes, "
        "mem-allocated-bytes, mem-max-allocated-bytes, mem-allocated-count); on a CPU run the process's "
        "resident memory instead (mem-host-rss-bytes, mem-host-max-rss-bytes).",
        requires=["tensorboard_dir", "wandb_project"])
    log_world_size_to_tensorboard: bool = opt(False, "Write the world size to TensorBoard.",
                                              requires=["tensorboard_dir", "wandb_project"])
    logging_level: int | None = opt(None, "Python logging level (10 debug, 20 info, 30 warning); the timers' "
                                       "report is at info. Default: $MEGATRON_LOGGING_LEVEL, else 20.")
    wandb_project: str | None = opt(None, "Log the TensorBoard scalars to this Weights & Biases project too "
                                       "(from the last rank; needs the wandb package: pip install -e '.[wandb]').")
    wandb_exp_name: str | None = opt(None, "The W&B run's name (default: W&B picks one).", requires="wandb_project")
    wandb_save_dir: str | None = opt(None, "Where W&B writes its files (default SAVE/wandb, with --save).",
                                     requires="wandb_project")
    wandb_entity: str | None = opt(None, "The W&B entity (team or user) of the project.", requires="wandb_project")
    profile: bool = opt(False, "Profile iterations --profile-step-start to --profile-step-end: with "
                        "--use-pytorch-profiler a torch.profiler trace, else the CUDA profiler API's capture range "
                        "for nsys (nsys profile --capture-range=cudaProfilerApi).")
    use_pytorch_profiler: bool = opt(
        False, "With --profile: record iterations START..END-1 with torch.profiler and write a Chrome/Perfetto "
        "trace, torch_profile/rank-R.json.gz beside --tensorboard-dir.", requires="profile")
    profile_step_start: int = opt(10, "Iteration to start profiling at.", requires="profile")
    profile_step_end: int = opt(12, "Iteration to stop profiling at.", requires="profile")
    profile_ranks: list[int] | None = opt(None, "Global ranks to profile (default: all).", nargs="+",
                                          requires="profile")
    pytorch_profiler_collect_shapes: bool = opt(False, "torch.profiler: record the operators' input shapes.",
                                                requires="use_pytorch_profiler")
    pytorch_profiler_collect_callstack: bool = opt(False, "torch.profiler: record the Python call stacks.",
                                                   requires="use_pytorch_profiler")
    flops_profiler_step: int | None = opt(
        None, "This project's (not in Megatron-LM; DeepSpeed's flops profiler): at this iteration measure every "
        "module's forward and backward FLOPs and time; the logging rank prints the table (module, parameters, FLOPs, "
        "time, achieved TFLOP/s, share of the step), also written to TensorBoard and --log-metrics-jsonl.")


def check_logging(cfg, world_size, cuda=None):
    """ConfigError for logging flags that cannot work, before anything runs. cuda: whether this
    machine has a GPU (default: torch.cuda.is_available())."""
    # a negative level or start iteration would never match anything: refused, not silently nothing
    check_ranges(cfg, {"logging_level": NON_NEGATIVE, "profile_step_start": NON_NEGATIVE}, flag_namer(cfg))
    if cfg.tensorboard_log_interval < 1 or cfg.tensorboard_queue_size < 1:
        raise ConfigError("--tensorboard-log-interval and --tensorboard-queue-size must be at least 1")
    if cfg.wandb_project:
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError(f"--wandb-project {cfg.wandb_project} needs the wandb package, which is not installed: "
                              "pip install -e '.[wandb]' (or pip install wandb), or drop --wandb-project")
        if not (cfg.wandb_save_dir or cfg.save):
            raise ConfigError("--wandb-project needs a directory for W&B's files: give --wandb-save-dir DIR "
                              "(or --save, whose wandb/ subdirectory is the default)")
    check_flops_profiler(cfg)
    if not cfg.profile:
        return
    if cfg.profile_step_end <= cfg.profile_step_start:
        raise ConfigError(f"--profile-step-end ({cfg.profile_step_end}) must be larger than --profile-step-start "
                          f"({cfg.profile_step_start})")
    outside = [r for r in cfg.profile_ranks or () if not 0 <= r < world_size]
    if outside:
        raise ConfigError(f"--profile-ranks {' '.join(map(str, outside))}: not a rank of this run's "
                          f"{world_size} (0 to {world_size - 1})")
    if cfg.use_pytorch_profiler and not cfg.tensorboard_dir:
        raise ConfigError("--use-pytorch-profiler writes its trace beside the TensorBoard logs "
                          "(DIR/../torch_profile): give --tensorboard-dir DIR")
    if not cfg.use_pytorch_profiler and not (torch.cuda.is_available() if cuda is None else cuda):
        raise ConfigError("--profile without --use-pytorch-profiler marks the steps for nsys through the CUDA "
                          "profiler API, which needs a GPU; add --use-pytorch-profiler for a torch.profiler trace")


def check_flops_profiler(cfg):
    """ConfigError for a --flops-profiler-step that would never run (train_iters resolved)."""
    step = cfg.flops_profiler_step
    if step is None:
        return
    if not 1 <= step <= cfg.train_iters:
        raise ConfigError(f"--flops-profiler-step {step}: not an iteration of this run (1 to {cfg.train_iters}); "
                          "give one of them")
    if cfg.skip_train:
        raise ConfigError("--flops-profiler-step measures a training iteration and --skip-train runs none; "
                          "drop one of them")


def configure_logging(level=None):
    """Megatron-LM's --logging-level: the root logger's level (level, else $MEGATRON_LOGGING_LEVEL,
    else INFO). The "megatron" logger (the timers' report) writes its messages to stdout."""
    if level is None:
        level = int(os.environ.get("MEGATRON_LOGGING_LEVEL", logging.INFO))
    logging.getLogger().setLevel(level)
    logger = logging.getLogger("megatron")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.handlers[0].setStream(sys.stdout)  # today's stdout (a caller may have replaced it since)
    return logger
