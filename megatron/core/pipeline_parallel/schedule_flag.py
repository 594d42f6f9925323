"""--pipeline-schedule: the flag's names for the schedules of SCHEDULES, checked against the layout."""
from typing import Optional

from ..config import ConfigError
from .schedules import default_schedule

FLAG_CHOICES = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v")
_NAMES = {"1f1b": "1f1b", "interleaved": "interleaved_1f1b", "zb-h1": "zb_h1", "zb-h2": "zb_h2"}


def schedule_for_flag(flag: Optional[str], P: int, V: int) -> str:
    """The SCHEDULES name for --pipeline-schedule `flag` with P pipeline ranks and V model
    chunks per rank (None: the default for the layout). Raises ConfigError naming the flag."""
    if flag is None:
        return default_schedule(P, V)
    if flag == "zb-v":
        raise ConfigError("--pipeline-schedule zb-v: the executor does not run the V layout yet (its schedule is "
                          "simulated only, pipeline_parallel/zb_v.py): use zb-h1 or zb-h2")
    if flag not in _NAMES:
        raise ConfigError(f"--pipeline-schedule {flag}: choose one of {', '.join(FLAG_CHOICES)}")
    if flag == "interleaved" and V == 1:
        raise ConfigError("--pipeline-schedule interleaved needs more than one model chunk per rank: "
                          "give --num-layers-per-virtual-pipeline-stage (or --virtual-pipeline-model-parallel-size)")
    if flag != "interleaved" and V > 1:
        raise ConfigError(f"--pipeline-schedule {flag} runs one model chunk per rank: drop "
                          "--num-layers-per-virtual-pipeline-stage, or use --pipeline-schedule interleaved")
    if P == 1:  # one stage: no pipeline to fill, plain gradient accumulation (and no split backward)
        return default_schedule(P, V)
    return _NAMES[flag]
