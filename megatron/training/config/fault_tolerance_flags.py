"""Flags of the fault-tolerance features (issue 41): what a run does when a save fails, non-persistent
(local) checkpoints, the rerun check, the straggler report. A base of
TrainingConfig, so the CLI is generated from these fields; Megatron-LM's flags keep its names and
defaults, this project's own say so in --help.

What implements them: training/checkpointing/save_failures.py, local_checkpoints.py, training/loop/rerun.py,
straggler.py. docs/fault_tolerance.md.
"""
import dataclasses
from dataclasses import dataclass

from ...core.config_fields import flag_namer, opt
from ...core.errors import ConfigError


@dataclass
class FaultToleranceOptions:
    max_consecutive_save_failures: int = opt(
        3, "This project's (not in Megatron-LM): a periodic save that fails (disk full, I/O error) is one warning "
        "line and training goes on, the next --save-interval trying again; this many failures in a row end the "
        "run (exit code 2) naming the cause. The final save (end of training, --exit-* flags) must succeed.")
    rerun_mode: str = opt(
        "validate_results", "On non-finite gradients or loss (or a spike, --check-for-spiky-loss) re-run the "
        "iteration once from the same state: reproducible means the data or the model, not reproducible a faulty "
        "device (exit code 16, naming rank and host); report_stats re-runs every iteration and reports the losses' "
        "variability; disabled: neither.", choices=["disabled", "validate_results", "report_stats"])
    check_for_spiky_loss: bool = opt(False, "Check for a loss over 10x the largest of the last 100 iterations' "
                                     "(re-run as --rerun-mode says).")
    log_straggler: bool = opt(False, "Every --log-interval iterations the logging rank prints the slowest and "
                              "fastest ranks' step times and their ratio.")
    straggler_ctrlr_port: int = opt(65535, "Port of Megatron-LM's server that toggles the straggler report at run "
                                    "time (not built here: accepted, no effect).")
    straggler_minmax_count: int = opt(1, "How many of the slowest and of the fastest ranks the straggler report "
                                      "names.")
    disable_straggler_on_startup: bool = opt(False, "Start with the straggler report off (with no server to turn it "
                                             "on here: no report).")
    non_persistent_save_interval: int | None = opt(
        None, "Iterations between non-persistent saves (with --save; not at iterations a persistent save writes).")
    non_persistent_ckpt_type: str | None = opt(
        None, "Type of non-persistent checkpoints: local (each rank writes its own state, checksummed, into "
        "--non-persistent-local-ckpt-dir, the last two kept; a restart loads them when newer than the persistent "
        "checkpoint and intact on every rank). global and in_memory are not built here.",
        choices=["global", "local", "in_memory"])
    non_persistent_global_ckpt_dir: str | None = opt(
        None, "Directory of global non-persistent checkpoints (--non-persistent-ckpt-type global: not built here).")
    non_persistent_local_ckpt_dir: str | None = opt(
        None, "Directory of local non-persistent checkpoints (one subdirectory per rank; node-local storage).")
    non_persistent_local_ckpt_algo: str = opt(
        "fully_parallel", "Algorithm of local non-persistent saves: each rank writes only its own state, atomically "
        "(a file renamed into place after its checksum), whichever is given.", choices=["fully_parallel", "atomic"])


def check_fault_tolerance(cfg) -> None:
    """ConfigError for values that do not fit (reads cfg only)."""
    f = flag_namer(cfg)
    if cfg.max_consecutive_save_failures < 1:
        raise ConfigError(f"{f('max_consecutive_save_failures')} must be at least 1 (1: the first failed save "
                          f"ends the run), got {cfg.max_consecutive_save_failures}")
    if cfg.straggler_minmax_count < 1:
        raise ConfigError(f"{f('straggler_minmax_count')} must be at least 1, got {cfg.straggler_minmax_count}")
    if not 0 < cfg.straggler_ctrlr_port < 65536:  # a TCP port, even though its server is not built
        raise ConfigError(f"{f('straggler_ctrlr_port')} must be a TCP port (1 to 65535), got "
                          f"{cfg.straggler_ctrlr_port}")
    kind, interval = cfg.non_persistent_ckpt_type, cfg.non_persistent_save_interval
    if kind in ("global", "in_memory"):
        raise ConfigError(f"{f('non_persistent_ckpt_type')} {kind} is not built here: use local (with "
                          f"{f('non_persistent_local_ckpt_dir')} DIR)")
    if interval is not None and interval < 1:
        raise ConfigError(f"{f('non_persistent_save_interval')} must be at least 1, got {interval}")
    if interval is not None and kind is None:
        raise ConfigError(f"{f('non_persistent_save_interval')} needs {f('non_persistent_ckpt_type')} local "
                          f"(and {f('non_persistent_local_ckpt_dir')} DIR)")
    if kind == "local" and not cfg.non_persistent_local_ckpt_dir:
        raise ConfigError(f"{f('non_persistent_ckpt_type')} local needs {f('non_persistent_local_ckpt_dir')} DIR "
                          "(a directory each rank can write, e.g. on a node-local disk)")
    if kind == "local" and cfg.use_checkpoint_args:  # as Megatron-LM
        raise ConfigError(f"--use-checkpoint-args does not work with {f('non_persistent_ckpt_type')} local "
                          "(a local checkpoint holds no arguments); drop one of the two")


def no_effect_rules(t):
    """(config, field name, applies, why) of these flags given where they change nothing (no_effect_flags.py)."""
    default = {f.name: f.default for f in dataclasses.fields(FaultToleranceOptions)}
    return [(t, "max_consecutive_save_failures", not t.save and t.max_consecutive_save_failures !=
             default["max_consecutive_save_failures"], "without --save nothing is saved"),
            (t, "non_persistent_save_interval", not t.save and t.non_persistent_save_interval is not None,
             "non-persistent saves go with --save, as in Megatron-LM"),
            (t, "straggler_ctrlr_port", t.straggler_ctrlr_port != default["straggler_ctrlr_port"],
             "the run-time straggler toggle server is not built"),
            (t, "check_for_spiky_loss", t.check_for_spiky_loss and t.rerun_mode == "disabled",
             "--rerun-mode disabled checks nothing"),
            (t, "straggler_minmax_count", t.straggler_minmax_count != default["straggler_minmax_count"] and
             not t.log_straggler, "without --log-straggler there is no straggler report"),
            (t, "non_persistent_local_ckpt_algo", t.non_persistent_local_ckpt_algo !=
             default["non_persistent_local_ckpt_algo"], "each rank always writes its own state atomically here"),
            (t, "non_persistent_global_ckpt_dir", t.non_persistent_global_ckpt_dir is not None,
             "--non-persistent-ckpt-type global is not built"),
            (t, "non_persistent_local_ckpt_dir", t.non_persistent_local_ckpt_dir is not None and
             t.non_persistent_ckpt_type != "local", "without --non-persistent-ckpt-type local it is not used")]
