"""Activation offload (--cpu-offloading) through the CLI: every layout with offload gives one process's run
(no offload) within 2e-6 at iteration 1 and 1e-5 over 10 iterations, losses and grad norms at full precision.

The default run keeps one process (the offload units around plain layers) and PP2 1F1B with full recompute
(units around checkpointed chunks: what recompute keeps goes, per micro-batch in flight); the rest, the same
hooks under other layouts (TP2 + SP, interleaved PP2, CP2, EP2 MoE, selective recompute, FP8), are in
tests/full_matrix.py. Bad values: the check's one line (ConfigError, which the CLI prints with exit 2).
"""
import re

import pytest

from megatron.core.errors import ConfigError
from megatron.training.config import no_effect_flags
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate

from .cli import run_metrics
from .test_moe_parity import MOE, TERMS
from .test_parity import BASE, DEEP, LLAMA, PP2, TP2, assert_metrics_parity

FLAGS = BASE + ["--train-iters", "10", "--eval-iters", "0"]  # the last occurrence of a flag wins
OFFLOAD = ["--cpu-offloading", "--cpu-offloading-num-layers", "1"]
FULL = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
SELECTIVE = ["--recompute-granularity", "selective"]
CP = LLAMA + ["--seq-length", "62", "--max-position-embeddings", "64"]
EP2 = ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]
FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo",
       "max"]

# name: (ranks, layout flags, model flags shared with the one-process reference, loss terms)
LAYOUTS = {
    "one": (1, [], [], ("lm loss",)),
    "pp2-1f1b-full-recompute": (2, PP2 + FULL, DEEP, ("lm loss",)),
    "one-selective": (1, SELECTIVE, [], ("lm loss",)),
    "tp2-sp": (2, TP2 + ["--sequence-parallel"], [], ("lm loss",)),
    "tp2-sp-selective": (2, TP2 + ["--sequence-parallel"] + SELECTIVE, [], ("lm loss",)),
    "pp2-1f1b": (2, PP2, DEEP, ("lm loss",)),
    "pp2-interleaved": (2, PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"], DEEP, ("lm loss",)),
    "cp2": (2, ["--context-parallel-size", "2"], CP, ("lm loss",)),
    "ep2-moe": (2, EP2, MOE, TERMS),
    "ep2-moe-selective": (2, EP2 + SELECTIVE, MOE, TERMS),
    "one-fp8": (1, [], FP8, ("lm loss",)),  # the FP8 linears keep FP8 inputs: those move
}
DEFAULT = ("one", "pp2-1f1b-full-recompute")

_reference = {}


def reference(model):
    """The one-process run without offload for these model flags, once per session."""
    key = tuple(model)
    if key not in _reference:
        _reference[key] = run_metrics(FLAGS + model)[1]
        assert sorted(_reference[key]["train"]) == list(range(1, 11))
    return _reference[key]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_offloaded_layout_matches_one_process(name):
    nproc, flags, model, terms = LAYOUTS[name]
    proc, got = run_metrics(FLAGS + model + flags + OFFLOAD, nproc=nproc)
    assert "> activation offload (--cpu-offloading): the first 1 layers" in proc.stdout
    assert_metrics_parity(reference(model), got, terms)


@pytest.mark.parametrize("flags,line", [
    (["--cpu-offloading-num-layers", "2"], "--cpu-offloading-num-layers 2 must be in [0, --num-layers (2))"),
    (["--cpu-offloading", "--no-cpu-offloading-activations"], "--cpu-offloading with --no-cpu-offloading-activations"),
])
def test_bad_offload_values_are_one_line(flags, line):
    """The check (the CLI prints a ConfigError as its one line with exit 2: test_optimizer_offload.py runs one)."""
    m, t = parse_args(FLAGS + flags)[:2]
    resolve(m, t, 1)
    with pytest.raises(ConfigError, match="^" + re.escape(line)):
        validate(m, t, 1)


def test_switches_without_offload_are_accepted_without_effect():
    for flags, named in ((["--cpu-offloading-weights"], "--cpu-offloading-weights"),
                         (["--no-cpu-offloading-activations"], "--no-cpu-offloading-activations"),
                         (["--cpu-offloading"], "--cpu-offloading")):
        m, t = parse_args(FLAGS + flags)[:2]
        resolve(m, t, 1)
        assert named in {flag for flag, _ in no_effect_flags.accepted(m, t)}
    m, t = parse_args(FLAGS + OFFLOAD + ["--cpu-offloading-weights"])[:2]
    resolve(m, t, 1)
    assert not {flag for flag, _ in no_effect_flags.accepted(m, t)} & {"--cpu-offloading", "--cpu-offloading-weights"}
