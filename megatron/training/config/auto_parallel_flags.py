"""--auto-parallel and --planner-gpu: this project's flags (Megatron-LM has neither), with which the run
asks the planner for the layout dimensions the command line does not give (training/planner/auto_parallel.py,
docs/planner.md). TrainingConfig inherits them."""
from dataclasses import dataclass

from ...core.config import opt


@dataclass
class AutoParallelOptions:
    auto_parallel: bool = opt(False, "This project's (not Megatron-LM's): let the planner choose the layout "
                              "dimensions not given on the command line (TP, SP, PP, VPP, CP, EP, micro batch, "
                              "recompute, distributed optimizer / ZeRO stage) for this world; the given ones are "
                              "kept. The start-up log prints the chosen flags (docs/planner.md).")
    planner_gpu: str | None = opt(None, "This project's: with --auto-parallel, plan as this GPU of the planner's "
                                  "calibration (e.g. H100-SXM) instead of the detected one (default: the CUDA "
                                  "device, or the measured CPU profile on CPU).")


def no_effect_rules(t):
    """(config, field, applies, why) for no_effect_flags: --planner-gpu without --auto-parallel."""
    return [(t, "planner_gpu", t.planner_gpu is not None and not t.auto_parallel,
             "without --auto-parallel nothing is planned")]
