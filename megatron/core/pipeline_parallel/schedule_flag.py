"""--pipeline-schedule: the flag's names for the schedules of SCHEDULES, checked against the layout."""

from ..config import ConfigError
from .schedules import default_schedule
from .split import v_layer_split

FLAG_CHOICES = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v")
_NAMES = {"1f1b": "1f1b", "interleaved": "interleaved_1f1b", "zb-h1": "zb_h1", "zb-h2": "zb_h2"}


def schedule_for_flag(flag: str | None, P: int, V: int) -> str:
    """The SCHEDULES name for --pipeline-schedule `flag` with P pipeline ranks and V interleaved model
    chunks per rank (None: the default for the layout; zb-v: its own two chunks in a V, check_v_layout).
    Raises ConfigError naming the flag. Run once, for the ParallelLayout (training/config/resolve.py)."""
    if flag is None:
        return default_schedule(P, V)
    if flag not in _NAMES and flag != "zb-v":
        raise ConfigError(f"--pipeline-schedule {flag}: choose one of {', '.join(FLAG_CHOICES)}")
    if P == 1 and flag.startswith("zb-"):  # one stage: no bubble to fill, and the split backward would only cost
        raise ConfigError(f"--pipeline-schedule {flag} needs --pipeline-model-parallel-size 2 or more: with one "
                          "stage there is no pipeline bubble to fill; drop the flag")
    if flag == "zb-v":
        return "zb_v"  # its two chunks per rank: ParallelLayout.chunks
    if flag == "interleaved" and V == 1:
        raise ConfigError("--pipeline-schedule interleaved needs more than one model chunk per rank: "
                          "give --num-layers-per-virtual-pipeline-stage (or --virtual-pipeline-model-parallel-size)")
    if flag != "interleaved" and V > 1:
        raise ConfigError(f"--pipeline-schedule {flag} runs one model chunk per rank: drop "
                          "--num-layers-per-virtual-pipeline-stage, or use --pipeline-schedule interleaved")
    if P == 1:  # 1f1b at one stage: plain gradient accumulation
        return default_schedule(P, V)
    return _NAMES[flag]


def check_v_layout(model_cfg, flag: str | None) -> None:
    """With --pipeline-schedule zb-v and more than one pipeline rank the layers go in a V, two model chunks
    per rank (ParallelLayout.v_shape, split.v_layer_split): ConfigError, naming the flag, for flags that
    place the layers otherwise or layers that do not split into 2P stages. Writes nothing."""
    P = model_cfg.pipeline_model_parallel_size
    if flag != "zb-v" or P == 1:
        return
    if model_cfg.virtual_pipeline_model_parallel_size or model_cfg.num_layers_per_virtual_pipeline_stage:
        raise ConfigError("--pipeline-schedule zb-v places its own two model chunks per rank: drop "
                          "--num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank")
    if model_cfg.decoder_first_pipeline_num_layers or model_cfg.decoder_last_pipeline_num_layers:
        raise ConfigError("--pipeline-schedule zb-v splits the layers evenly over 2P stages: drop "
                          "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers")
    v_layer_split(model_cfg.num_layers, P)  # the layers must divide into 2P stages
