"""--compile-layers: each transformer layer under torch.compile (inductor's CPU backend here) gives the
losses and grad norms of the eager one-process run at fp32, and says what it compiled and where the
graph broke. The default run keeps TP2 + SP (the collectives' graph breaks, the compiled layers and
their validation graph); one process and PP2 with full recompute are in tests/full_matrix.py."""
import re

import pytest

from .cli import run_cli, run_metrics
from .test_parity import assert_metrics_parity

ITERS = 4
BASE = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512",
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--train-iters", str(ITERS), "--log-interval", "1", "--eval-iters", "1", "--eval-interval", "2",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--lr", "2e-3",
        "--lr-warmup-iters", "1", "--seed", "7"]
COMPILE = ["--compile-layers"]
REPORT = re.compile(r"> compiled layers: (\d+) transformer layers under torch.compile \(inductor: C\+\+ on the CPU; "
                    r"csrc kernels step aside inside them\), (\d+) graphs, (\d+) graph breaks")

# validation reports the LM loss alone: none here, so each record holds every term (the last flag wins)
MOE = ["--num-experts", "2", "--moe-router-topk", "1", "--moe-token-dispatcher-type", "alltoall",
       "--moe-aux-loss-coeff", "1e-2", "--disable-bias-linear", "--eval-iters", "0"]
_reference = {}


def reference(model_flags):
    """The eager one-process run of these model flags, once."""
    key = tuple(model_flags)
    if key not in _reference:
        _reference[key] = run_metrics(BASE + model_flags)[1]
    return _reference[key]


CASES = {  # (model flags, layout flags, ranks)
    "one-process": ([], [], 1),
    "tp2-sp": ([], ["--tensor-model-parallel-size", "2", "--sequence-parallel"], 2),
    "pp2-recompute": ([], ["--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                           "--recompute-method", "uniform", "--recompute-num-layers", "1"], 2),
    "moe-ep2": (MOE, ["--expert-model-parallel-size", "2"], 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_layers_match_eager_one_process(case):
    model, layout, nproc = CASES[case]
    proc, got = run_metrics(BASE + model + layout + COMPILE, nproc=nproc)
    report = REPORT.search(proc.stdout)
    assert report, f"no compiled-layers line in:\n{proc.stdout[-3000:]}"
    print(report.group(0))
    layers, graphs, breaks = map(int, report.groups())
    assert layers == 2 // (2 if "pp2" in case else 1) and graphs >= 1
    terms = ("lm loss", "load_balancing_loss") if model else ("lm loss",)
    if "tp2" in case:  # the TP / SP collectives break the graph; counted, not hidden
        assert breaks > 0
    assert_metrics_parity(reference(model), got, terms)


def test_compiled_layers_with_fp8_is_one_line_exit_2():
    """Through the CLI (the other refusals: tests/unit/test_compile_flags.py, at the check function)."""
    proc = run_cli(BASE + COMPILE + ["--fp8-format", "e4m3"], check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert errors[0].startswith("error: --compile-layers with --fp8-format is not built"), errors[0]
    assert "Traceback" not in proc.stderr and "iteration " not in proc.stdout
