"""What the pretrain loop observes with: the logger (iteration line, TensorBoard, W&B), the timers and
the profiler, built from the logging flags (logging_flags.py), and the start-up line that names them."""
from ...core.timers import Timers
from ..config.logging_flags import configure_logging
from .flops import peak_tflops_per_gpu
from .log import TrainingLogger, is_logging_rank, print_rank_0
from .profiling import StepProfiler
from .profiling import describe as describe_profile
from .scalar_writers import open_writers


def open_observability(model_cfg, train_cfg, groups, device, loaded_iteration):
    """-> (TrainingLogger, Timers, StepProfiler). Collective over the world with --wandb-project
    (scalar_writers.open_writers); raises ConfigError when W&B cannot start."""
    t = train_cfg
    configure_logging(t.logging_level)
    timers = Timers(t.timing_log_level, t.timing_log_option, device, t.barrier_with_l1_time)
    writers = open_writers(t, model_cfg, is_logging_rank(), groups.world_size)
    peak = peak_tflops_per_gpu(device, model_cfg.params_dtype, model_cfg.fp8_format is not None)
    logger = TrainingLogger(t.train_iters, writers, peak[1] if peak else None, t, timers)
    print_rank_0(startup_line(t))
    return logger, timers, StepProfiler(t, groups.rank, loaded_iteration, device)


def startup_line(t):
    """One line: what is logged beyond the iteration line, and where."""
    parts = [f"timers level {t.timing_log_level}"
             + (f" ({t.timing_log_option}{', barrier at level 1' if t.barrier_with_l1_time else ''})"
                if t.timing_log_level else " (none)")]
    extra = [name for name, on in (("throughput", t.log_throughput), ("params norm", t.log_params_norm),
                                   ("num zeros", t.log_num_zeros_in_grad)) if on]
    if extra:
        parts.append("in the iteration line: " + ", ".join(extra))
    sinks = [f"TensorBoard {t.tensorboard_dir}" if t.tensorboard_dir else None,
             f"W&B project {t.wandb_project}" if t.wandb_project else None]
    if any(sinks):
        tb = [name for name, on in (("timers", t.log_timers_to_tensorboard), ("memory", t.log_memory_to_tensorboard),
                                    ("validation ppl", t.log_validation_ppl_to_tensorboard)) if on]
        parts.append(" and ".join(s for s in sinks if s) + f" every {t.tensorboard_log_interval} iteration(s)"
                     + (" with " + ", ".join(tb) if tb else ""))
    profile = describe_profile(t)
    if profile:
        parts.append("profile: " + profile)
    elif t.use_pytorch_profiler:
        parts.append("--use-pytorch-profiler has no effect without --profile")
    return "> logging: " + " | ".join(parts)
