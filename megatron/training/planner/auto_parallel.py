"""--auto-parallel: the planner chooses the layout dimensions the command line does not give.

    configs, lines = choose_and_parse(argv, parse, extra)   # before any process group exists

The user's layout flags pin their dimensions (as tools/plan.py --fix); every other dimension the planner
searches (predict.plan) on the Cluster of this world (cluster_of). The chosen layout's flags are appended to
the command line and it is parsed again, so the run is exactly the one the printed command line gives.

Every rank computes the choice itself, without a collective: the inputs are the same on every rank (the
command line, WORLD_SIZE, LOCAL_WORLD_SIZE, the calibration table or the cached CPU profile) and the
arithmetic is plain Python on them, sorted with a total order (fits, step time, memory, label). A broadcast
would need the process groups, which must be built for the chosen layout.
"""
import argparse
import dataclasses
import functools
import os

from ...core.config import ConfigError
from ...core.config_fields import flag_of
from ...core.datasets.index_cache import default_cache_root
from ..config.arguments import parse_args
from .cpu_calibration import cpu_cluster as measured_cpu_cluster
from .hardware import Cluster
from .predict import Prediction, configs, plan
from .world_cluster import cluster_of

# dimension -> (flags that pin it, its value from the parsed (model, training) configs)
PINS = {
    "tp": (("--tensor-model-parallel-size",), lambda m, t: m.tensor_model_parallel_size),
    "pp": (("--pipeline-model-parallel-size",), lambda m, t: m.pipeline_model_parallel_size),
    "cp": (("--context-parallel-size",), lambda m, t: m.context_parallel_size),
    "cp_comm": (("--cp-comm-type",), lambda m, t: m.cp_comm_type),
    "ep": (("--expert-model-parallel-size",), lambda m, t: m.expert_model_parallel_size),
    "mb": (("--micro-batch-size",), lambda m, t: t.micro_batch_size),
    "sp": (("--sequence-parallel",), lambda m, t: True),
    # --use-distributed-optimizer is Megatron-LM's alias of the optim sharding (ZeRO-1)
    "dist_opt": (("--use-distributed-optimizer", "--data-parallel-sharding-strategy"),
                 lambda m, t: _strategy(t) != "no_shard"),
    "zero": (("--use-distributed-optimizer", "--data-parallel-sharding-strategy"), lambda m, t: _strategy(t)),
    "recompute": (("--recompute-granularity",), lambda m, t: m.recompute_granularity),
}


def _strategy(t) -> str:
    """The ZeRO stage the command line gives (before resolve: --use-distributed-optimizer alone is optim)."""
    return t.data_parallel_sharding_strategy or ("optim" if t.use_distributed_optimizer else "no_shard")


# flags whose choice the planner neither searches nor prices: under --auto-parallel each is one line, exit 2
UNSEARCHABLE = {
    "decoder_first_pipeline_num_layers": "the planner prices even pipeline splits only",
    "decoder_last_pipeline_num_layers": "the planner prices even pipeline splits only",
    "virtual_pipeline_model_parallel_size": "give --num-layers-per-virtual-pipeline-stage with "
                                            "--pipeline-model-parallel-size instead, or neither",
    "use_megatron_fsdp": "give --data-parallel-sharding-strategy instead, or leave the ZeRO stage to the planner",
    "optimizer_cpu_offload": "the planner's memory and time models do not price optimizer offload",
}


@dataclasses.dataclass
class Choice:
    best: Prediction
    ranked: list           # every valid layout's Prediction, best first
    refused: int           # layouts the configuration checks refused
    pinned: dict           # {dimension: value} the command line gave
    argv: list             # the command line with the chosen layout's flags
    cluster: Cluster
    source: str            # where the cluster's figures come from


def given(argv) -> set:
    """The flags on the command line (--flag and --flag=value alike)."""
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def model_argv(argv, extra=()) -> list:
    """argv without the flags of the `extra` option dataclasses (BERT's, the embedded recipe's), which the
    planner's parser (pretrain_gpt.py's) does not know."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for _, cls in extra:
        for f in dataclasses.fields(cls):
            if f.metadata.get("cli") is False:
                continue
            if f.type is bool or f.type == "bool":
                parser.add_argument(flag_of(cls, f.name), action="store_true", dest=f.name)
            else:
                parser.add_argument(flag_of(cls, f.name), nargs=f.metadata.get("nargs"), dest=f.name)
    return parser.parse_known_args(list(argv))[1]


def check_searchable(argv, model_cfg, train_cfg) -> None:
    """ConfigError (one line) for a command line --auto-parallel cannot plan."""
    if train_cfg.global_batch_size is None:
        raise ConfigError("--auto-parallel needs --global-batch-size: the batch every layout must run (without "
                          "it the batch would follow the chosen data-parallel size)")
    flags = given(argv)
    for name, why in UNSEARCHABLE.items():
        cfg = model_cfg if hasattr(model_cfg, name) else train_cfg
        flag = flag_of(type(cfg), name)
        if flag in flags:
            raise ConfigError(f"--auto-parallel cannot plan with {flag} ({why}): drop {flag} or --auto-parallel")
    if "--num-layers-per-virtual-pipeline-stage" in flags and "--pipeline-model-parallel-size" not in flags:
        raise ConfigError("--auto-parallel with --num-layers-per-virtual-pipeline-stage needs "
                          "--pipeline-model-parallel-size too (the chunk size fixes the chunks per stage only "
                          "for a given pipeline size)")


def pinned(argv, model_cfg, train_cfg) -> dict:
    """{dimension: value} of the layout dimensions the command line gives."""
    flags = given(argv)
    out = {dim: value(model_cfg, train_cfg) for dim, (names, value) in PINS.items() if flags & set(names)}
    if "--num-layers-per-virtual-pipeline-stage" in flags:
        pp, per_chunk = model_cfg.pipeline_model_parallel_size, model_cfg.num_layers_per_virtual_pipeline_stage
        out["vpp"] = max(1, model_cfg.num_layers // (pp * per_chunk))
    if out.get("zero") == "no_shard":
        out["dist_opt"] = False
    return out


def rank(preds) -> list:
    """Best first: fitting before not fitting, then step time, memory, and the label (a total order, so
    equal predictions never leave the choice to the enumeration order)."""
    return sorted(preds, key=lambda p: (not p.fits, p.step.total, p.memory_bytes, p.label))


def choose(argv, model_cfg, train_cfg, cluster: Cluster, source="") -> Choice:
    """The chosen layout of pretrain_gpt.py flags `argv` (parsed into model_cfg, train_cfg) on `cluster`.
    Raises ConfigError for a command line that cannot be planned or a world no layout fits."""
    check_searchable(argv, model_cfg, train_cfg)
    pins = pinned(argv, model_cfg, train_cfg)
    preds, refused = plan(argv, cluster, pins)
    ranked = rank(preds)
    if not ranked:
        configs(argv, cluster.num_gpus)  # the command line's own error, when it is the command line's
        pins_text = f" with {_pins_text(pins)}" if pins else ""
        raise ConfigError(f"--auto-parallel: no layout of this model is valid on {cluster.num_gpus} ranks"
                          f"{pins_text} ({refused} refused by the configuration checks); change the world size, "
                          "--global-batch-size or the pinned layout flags")
    if not ranked[0].fits:
        raise ConfigError(nothing_fits(argv, ranked, pins, cluster))
    best = ranked[0]
    return Choice(best, ranked, refused, pins, list(argv) + best.flags[len(argv):], cluster, source)


def _pins_text(pins) -> str:
    return ", ".join(f"{k}={v}" for k, v in pins.items())


def nothing_fits(argv, ranked, pins, cluster) -> str:
    """The one line of a world no layout fits: the smallest predicted peak, the memory, and what would fit."""
    small = min(ranked, key=lambda p: (p.memory_bytes, p.label))
    head = (f"--auto-parallel: no layout fits on {cluster.num_gpus} x {cluster.gpu}: the smallest predicted peak is "
            f"{small.memory_bytes / 1e9:.2f} GB ({small.label}) > {cluster.memory_bytes / 1e9:.2f} GB per GPU; ")
    if pins:
        fit = next((p for p in rank(plan(argv, cluster, {})[0]) if p.fits), None)  # the fastest that fits
        if fit is not None:
            return head + (f"without the pinned {_pins_text(pins)} it fits as {fit.label} "
                           f"({fit.memory_bytes / 1e9:.2f} GB): drop those flags")
    tried = "full recompute and ZeRO-3 included" if not pins else f"with {_pins_text(pins)}"
    for more in (2, 4, 8):  # the fewest GPUs (of 2x, 4x, 8x) on which a layout fits, when one does
        bigger = dataclasses.replace(cluster, num_gpus=more * cluster.num_gpus)
        fit = next((p for p in rank(plan(argv, bigger, pins)[0]) if p.fits), None)
        if fit is not None:
            return head + (f"every layout was tried ({tried}): it fits on {bigger.num_gpus} GPUs as {fit.label} "
                           f"({fit.memory_bytes / 1e9:.2f} GB); or shorten --seq-length, or shrink the model")
    return head + (f"every layout was tried ({tried}), on up to {8 * cluster.num_gpus} GPUs too: shorten "
                   "--seq-length or shrink the model")


def why_lost(p: Prediction, best: Prediction, cluster: Cluster) -> str:
    """What makes `p` lose to `best`: not fitting, or its predicted time and the part that grew most."""
    if not p.fits:
        return f"does not fit ({p.memory_bytes / 1e9:.2f} GB > {cluster.memory_bytes / 1e9:.2f} GB)"
    a, b = p.step, best.step
    if a.total <= b.total:
        return (f"predicted as fast, ranked after it by memory ({p.memory_bytes / 1e9:.4g} GB vs "
                f"{best.memory_bytes / 1e9:.4g}) or name")
    parts = {"pipeline compute" + (f" (bubble {100 * a.bubble:.0f}% vs {100 * b.bubble:.0f}%)"
                                   if a.bubble != b.bubble else ""): a.pipeline - b.pipeline,
             "exposed data-parallel communication": a.dp_exposed - b.dp_exposed,
             "optimizer step": a.optimizer - b.optimizer, "gradient finalize": a.finalize - b.finalize}
    what, extra = max(parts.items(), key=lambda kv: kv[1])
    return f"{100 * (a.total / b.total - 1):.1f}% slower, mostly {what} (+{_ms(extra)})"


def _ms(seconds) -> str:
    return f"{1e3 * seconds:.4g} ms"


def log_lines(choice: Choice, script: str, world_size: int, per_node: int) -> list[str]:
    """The start-up lines: what was planned, the choice with its full command line, the next two."""
    c, best = choice.cluster, choice.best
    fits = sum(p.fits for p in choice.ranked)
    pins = f"pinned by the command line: {_pins_text(choice.pinned)}" if choice.pinned else "nothing pinned"
    lines = [f"> auto-parallel (docs/planner.md): {len(choice.ranked)} layouts on {world_size} x {c.gpu} "
             f"({per_node} per node; {choice.source}), {fits} fit in {c.memory_bytes / 1e9:.2f} GB, "
             f"{choice.refused} refused by the checks; {pins}",
             f"> auto-parallel: chosen {best.label}: predicted {_ms(best.step.total)} per iteration, "
             f"{best.memory_bytes / 1e9:.4g} GB on the most loaded GPU, MFU {100 * best.mfu:.2f}%",
             f"> auto-parallel: the same run without it: torchrun --nnodes {max(1, world_size // per_node)} "
             f"--nproc-per-node {min(world_size, per_node)} {script} "
             + " ".join(without_auto(choice.argv))]
    for i, p in enumerate(choice.ranked[1:3], start=2):
        lines.append(f"> auto-parallel: #{i} {p.label}: {_ms(p.step.total)}, {why_lost(p, best, c)}")
    return lines


def per_node_of(world_size) -> int:
    """Ranks per node: torchrun's LOCAL_WORLD_SIZE (the whole world without torchrun)."""
    return max(1, min(world_size, int(os.environ.get("LOCAL_WORLD_SIZE", world_size))))


def choose_and_parse(argv, parse, extra=(), script="pretrain_gpt.py", cpu_cluster=None):
    """parse(argv) -> the configs; with --auto-parallel the configs of argv plus the chosen layout's flags.
    -> (configs, start-up lines). cpu_cluster: (world_size, per_node) -> (Cluster, source) off CUDA (default:
    cpu_calibration's, cached under --data-cache-path). extra: the script's own option dataclasses (not the
    planner's). Raises ConfigError for a command line the planner cannot plan, an unknown --planner-gpu, or a
    world nothing fits."""
    parsed = parse(argv)
    if not parsed[1].auto_parallel:
        return parsed, []
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = per_node_of(world)
    if cpu_cluster is None:  # on CPU without --planner-gpu: this machine's measured profile, cached
        cache = os.path.join(parsed[1].data_cache_path or default_cache_root(), "planner")
        cpu_cluster = functools.partial(measured_cpu_cluster, cache_dir=cache)
    cluster, source = cluster_of(parsed[1].planner_gpu, world, per_node, cpu_cluster)
    plain = model_argv(argv, extra)
    model_cfg, train_cfg = parse_args(plain)[:2]
    choice = choose(plain, model_cfg, train_cfg, cluster, source)
    choice.argv = list(argv) + new_flags(choice.best.flags[len(plain):], given(argv))
    return parse(choice.argv), log_lines(choice, script, world, per_node)


def new_flags(layout_flags, flags) -> list:
    """layout_flags without the flags (and their values) already in `flags`: a pinned dimension's flag
    has the command line's value, so the printed command line gives each flag once."""
    out, keep = [], True
    for a in layout_flags:
        if a.startswith("--"):
            keep = a not in flags
        if keep:
            out.append(a)
    return out


def without_auto(argv) -> list:
    """argv without --auto-parallel and --planner-gpu NAME (no effect once the layout is given)."""
    out, skip = [], False
    for a in argv:
        if skip or a == "--auto-parallel" or a.startswith("--planner-gpu="):
            skip = False
            continue
        skip = a == "--planner-gpu"
        if not skip:
            out.append(a)
    return out
