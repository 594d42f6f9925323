"""--optimizer muon through the CLI: every layout gives one process's Muon losses and grad norms
(iteration 1 within 2e-6, every iteration and validation within 1e-5; fp32, Newton-Schulz in fp32 on CPU).

What each default case proves that no other does:
  tp2-sp                the whole matrices gathered over TP (duplicated), Q/K/V split by query groups per shard
  tp2-sp-distributed    Newton-Schulz with the Gram matrix all-reduced over TP
  distopt-tp2-pp2-dp2   matrices owned by DP ranks (momentum in the ZeRO-1 slices, gathered to the owner and
                        the update scattered back), the owners' TP collectives, per pipeline stage
  zero3-dp2             the same with ZeRO-3's sharded parameters and gradients
  moe-ep2-distopt       each expert's matrices (grouped GEMM) owned over expert-DP, the dense over DP
  moe-tp2-ep2-folded    expert matrices whole at expert-TP 1 while the dense are gathered over TP
The rest (tests/full_matrix.py) run the same code in wider or other groups.
"""
import pytest

from .cli import run_metrics
from .test_parity import BASE, DEEP, LLAMA, SMALL_BUCKETS, assert_metrics_parity

ITERS = 10
FLAGS = BASE + ["--train-iters", str(ITERS), "--eval-interval", "5", "--optimizer", "muon"] + LLAMA
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "96", "--moe-aux-loss-coeff", "1e-2",
       "--moe-grouped-gemm", "--eval-iters", "0"]  # validations log the token loss only
TERMS = ("lm loss", "load_balancing_loss")
TP2, PP2, DP_OPT = ["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"], \
    ["--use-distributed-optimizer"] + SMALL_BUCKETS
EP2 = ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]

LAYOUTS = {  # name: (ranks, layout flags, model flags the one-process reference shares)
    "tp2-sp": (2, TP2 + ["--sequence-parallel"], []),
    "tp2-sp-distributed": (2, TP2 + ["--sequence-parallel", "--muon-tp-mode", "distributed"], []),
    "distopt-tp2-pp2-dp2": (8, TP2 + PP2 + DP_OPT, DEEP),
    "zero3-dp2": (2, ["--data-parallel-sharding-strategy", "optim_grads_params"] + SMALL_BUCKETS, []),
    "moe-ep2-distopt": (4, EP2 + DP_OPT, MOE),
    "moe-tp2-ep2-folded": (2, TP2 + ["--expert-tensor-parallel-size", "1", "--sequence-parallel"] + EP2, MOE),
    # full matrix only
    "tp4": (4, ["--tensor-model-parallel-size", "4"], ["--num-query-groups", "4"]),
    "tp2-distributed-nesterov": (2, TP2 + ["--muon-tp-mode", "distributed", "--muon-nesterov"], ["--muon-nesterov"]),
    "pp2": (2, PP2, DEEP),
    "pp2-vpp2": (2, PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"], DEEP),
    "pp2-zb-h1": (2, PP2 + ["--pipeline-schedule", "zb-h1"], DEEP),
    "distopt-dp2": (2, DP_OPT, []),
    "zero2-dp2-overlap": (2, ["--data-parallel-sharding-strategy", "optim_grads", "--overlap-grad-reduce"]
                          + SMALL_BUCKETS, []),
    "cp2": (2, ["--context-parallel-size", "2"], []),
    "moe-ep2": (2, EP2, MOE),
    "moe-tp2-ep2-sp": (4, TP2 + ["--sequence-parallel"] + EP2, MOE),
}
_ref = {}


def reference(model):
    key = tuple(model)
    if key not in _ref:
        _ref[key] = run_metrics(FLAGS + model)[1]
        assert sorted(_ref[key]["train"]) == list(range(1, ITERS + 1))
    return _ref[key]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_muon_layout_matches_one_process(name):
    nproc, flags, model = LAYOUTS[name]
    got = run_metrics(FLAGS + model + flags, nproc=nproc)[1]
    assert_metrics_parity(reference(model), got, TERMS if "--num-experts" in model else ("lm loss",))
