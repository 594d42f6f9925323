"""Flags of the fault-tolerance features (issue 41): what a run does when a save fails. A base of
TrainingConfig, so the CLI is generated from these fields; Megatron-LM's flags keep its names and
defaults, this project's own say so in --help.

What implements them: training/checkpointing/save_failures.py. docs/fault_tolerance.md.
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


def check_fault_tolerance(cfg) -> None:
    """ConfigError for values that do not fit (reads cfg only)."""
    f = flag_namer(cfg)
    if cfg.max_consecutive_save_failures < 1:
        raise ConfigError(f"{f('max_consecutive_save_failures')} must be at least 1 (1: the first failed save "
                          f"ends the run), got {cfg.max_consecutive_save_failures}")


def no_effect_rules(t):
    """(config, field name, applies, why) of these flags given where they change nothing (no_effect_flags.py)."""
    default = {f.name: f.default for f in dataclasses.fields(FaultToleranceOptions)}
    return [(t, "max_consecutive_save_failures", not t.save and t.max_consecutive_save_failures !=
             default["max_consecutive_save_failures"], "without --save nothing is saved")]
