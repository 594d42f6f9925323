"""FP8 parity through the CLI: every layout running FP8 GEMMs equals one process running them.

Exact up to fp32 summation order because each tensor split over ranks takes the MAX of its pieces'
amaxes over the groups holding them (TP shards and sequence-parallel pieces, CP chunks), so every element
is cast with the one-process scale to the same FP8 value; delayed scaling's step amaxes are also reduced
over DP x CP (the step's other microbatches). Blockwise tiles never cross a rank boundary (sizes that are
multiples of 128). fp32 master weights; tolerances as every parity test (test_parity.py).
"""
import pytest

from .cli import run_metrics
from .test_parity import BASE, assert_metrics_parity, max_relative_differences

RECIPES = {
    "tensorwise": ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    "delayed": ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4",
                "--fp8-amax-compute-algo", "max"],
    "blockwise": ["--fp8-format", "hybrid", "--fp8-recipe", "blockwise"],
}
# blockwise at TP2: every TP-split dimension a multiple of 128 (QKV 384, projection input 128, fc1/fc2 512)
BLOCK_SHAPE = ["--hidden-size", "256", "--seq-length", "32", "--micro-batch-size", "1"]
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
LAYOUTS = {  # name: (processes, flags)
    "tp2-sp": (2, TP2_SP),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "distopt-dp2": (2, ["--use-distributed-optimizer"]),
    "zero3-dp2": (2, ["--data-parallel-sharding-strategy", "optim_grads_params"]),
    "cp2": (2, ["--context-parallel-size", "2"]),
}
CASES = [(r, layout) for r in ("tensorwise", "delayed") for layout in LAYOUTS] + \
    [("blockwise", "tp2-sp"), ("blockwise", "distopt-dp2")]

_reference = {}


def _model(recipe):
    return RECIPES[recipe] + (BLOCK_SHAPE if recipe == "blockwise" else [])


def reference(flags):
    key = tuple(flags)
    if key not in _reference:
        _reference[key] = run_metrics(BASE + flags)[1]
    return _reference[key]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,layout", CASES, ids=[f"{r}-{layout}" for r, layout in CASES])
def test_fp8_layout_matches_one_process_fp8(recipe, layout):
    nproc, flags = LAYOUTS[layout]
    got = run_metrics(BASE + _model(recipe) + flags, nproc=nproc)[1]
    assert_metrics_parity(reference(_model(recipe)), got)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_fp8_changes_the_result(recipe):
    """FP8 is on: the one-process FP8 run differs from the same run in fp32 (else parity proves nothing)."""
    shape = BLOCK_SHAPE if recipe == "blockwise" else []
    diff = max_relative_differences(reference(shape), reference(_model(recipe)))
    print(f"{recipe} vs fp32: {diff}")
    assert diff["first"] > 1e-5
