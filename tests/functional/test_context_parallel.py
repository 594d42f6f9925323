"""Context parallelism through the CLI: per-iteration losses and grad norms of one process.

One reference (Llama-style: rope, GQA, RMSNorm, SwiGLU, untied; sequence 62, not a multiple of
2 x CP, so the CP ranks pad it with masked tokens) and four layouts, each proving something the
others do not: the ring alone; Ulysses with TP and sequence parallelism (GQA's 1 group per TP rank
is expanded for the all-to-all, padding to 2 x CP x TP); all_gather under pipelining; the ring with
DP, the distributed optimizer (shards over DP x CP) and selective recompute. CP4 and 8-rank
TP2 x CP2 x PP2 are run by hand (docs in the issue note)."""
import pytest

from .cli import run_metrics
from .test_parity import BASE, LLAMA, assert_metrics_parity

SHORT = ["--seq-length", "62", "--max-position-embeddings", "64", "--train-iters", "4", "--eval-iters", "0"]
MODEL = LLAMA + SHORT
CP2 = ["--context-parallel-size", "2"]

LAYOUTS = {
    "cp2-p2p": (2, CP2),
    "tp2-cp2-sp-a2a": (4, CP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--cp-comm-type", "a2a"]),
    "pp2-cp2-all_gather": (4, CP2 + ["--pipeline-model-parallel-size", "2", "--cp-comm-type", "all_gather"]),
    "cp2-dp2-distopt-recompute": (4, CP2 + ["--use-distributed-optimizer", "--ddp-bucket-size", "20000",
                                            "--recompute-granularity", "selective"]),
}

_reference = {}


def reference():
    """The one-process run of MODEL, once per session."""
    if not _reference:
        _reference["one"] = run_metrics(BASE + MODEL)[1]
        assert sorted(_reference["one"]["train"]) == [1, 2, 3, 4]
    return _reference["one"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_context_parallel_layout_matches_one_process(name):
    nproc, flags = LAYOUTS[name]
    got = run_metrics(BASE + MODEL + flags, nproc=nproc)[1]
    assert_metrics_parity(reference(), got)
