"""MoE parallel folding (--expert-tensor-parallel-size below TP) through the CLI: each layout gives
the per-iteration losses (token loss, both router losses) and grad norms of one process, and
checkpoints cross between a folded layout and one process both ways. fp32, dropout 0, dropless.

Each layout proves something the others do not:
  TP2 x ETP1 x EP2 (2 ranks), alltoall, no sequence parallelism, grouped GEMM: EP spans the TP
      ranks; each TP rank routes its 1/TP slice of the replicated tokens and the outputs are
      all-gathered back; the router's counts and losses summed over TP; its gradient summed over TP
  TP2 x DP2 x ETP1 x EP4 (4 ranks), allgather, sequence parallel, distributed optimizer: one EP
      group over all ranks (expert-DP 1), the dense optimizer shards over DP beside it
  TP4 x ETP2 x EP2 (4 ranks), alltoall, sequence parallel, replicated optimizer: expert-TP < TP;
      tokens gathered over expert-TP with uneven counts and outputs reduce-scattered; expert
      shards over expert-TP in init and in the grad norm (summed over expert-TP x EP)
  TP2 x DP2 x ETP1 (EP1, 4 ranks), ZeRO-3 with overlap: the expert buffers sharded and gathered over the
      folded expert-DP group, all 4 ranks, while the dense ones are sharded over DP's 2 (at EP2 the
      folded expert-DP group would equal DP and could not tell them apart)
  TP2 x PP2 x ETP1 x EP2 (4 ranks), seq_aux_loss + expert bias: saves at iteration 2 and one
      process continues (3-4); the bias's load counts summed over TP; expert grad norm over stages
  one process saves at iteration 2 and TP2 x ETP1 (EP1) continues: a checkpoint loads into the
      folded grid; every rank holds all experts and their grads are summed over expert-DP (= the TP
      ranks, each routing its own tokens)
"""
import pytest

from .cli import run_metrics
from .test_moe_parity import FLAGS, MOE, TERMS
from .test_parity import assert_metrics_parity

pytestmark = pytest.mark.slow

FOLD = ["--expert-tensor-parallel-size", "1"]
TP2 = ["--tensor-model-parallel-size", "2"]
ROUTER = ["--moe-router-load-balancing-type", "seq_aux_loss", "--moe-router-enable-expert-bias",
          "--moe-router-bias-update-rate", "0.05"]  # a rate that moves the routing within 4 iterations
_ref = {}


def reference(extra=()):
    """The one-process run's metrics for MOE + extra model flags (run once each)."""
    key = tuple(extra)
    if key not in _ref:
        _ref[key] = run_metrics(FLAGS + MOE + list(extra))[1]
    return _ref[key]


LAYOUTS = {  # name: (ranks, layout flags)
    "tp2-etp1-ep2-alltoall-grouped": (2, TP2 + FOLD + ["--expert-model-parallel-size", "2", "--moe-grouped-gemm",
                                                       "--moe-token-dispatcher-type", "alltoall"]),
    "tp2xdp2-etp1-ep4-allgather-sp-distopt": (4, TP2 + FOLD + ["--expert-model-parallel-size", "4",
                                                               "--sequence-parallel", "--use-distributed-optimizer"]),
    "tp4-etp2-ep2-alltoall-sp": (4, ["--tensor-model-parallel-size", "4", "--expert-tensor-parallel-size", "2",
                                     "--expert-model-parallel-size", "2", "--sequence-parallel",
                                     "--moe-token-dispatcher-type", "alltoall"]),
    "tp2xdp2-etp1-ep1-sp-zero3-overlap": (4, TP2 + FOLD + [
        "--sequence-parallel", "--data-parallel-sharding-strategy", "optim_grads_params", "--overlap-grad-reduce"]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_folded_layout_matches_one_process(name):
    nproc, flags = LAYOUTS[name]
    got = run_metrics(FLAGS + MOE + flags, nproc=nproc)[1]
    assert_metrics_parity(reference(), got, TERMS)


def test_checkpoint_saved_folded_continues_at_one_process_and_back(tmp_path):
    ref = reference(ROUTER)
    folded = TP2 + FOLD + ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                           "--pipeline-model-parallel-size", "2"]
    save = ["--save-interval", "2", "--exit-interval", "2"]
    for saver, nproc, loader, load_nproc in ((folded, 4, [], 1), ([], 1, TP2 + FOLD, 2)):
        d = str(tmp_path / f"saved{nproc}")
        first = run_metrics(FLAGS + MOE + ROUTER + saver + save + ["--save", d], nproc=nproc)[1]
        second = run_metrics(FLAGS + MOE + ROUTER + loader + ["--load", d], nproc=load_nproc)[1]
        assert sorted(first["train"]) == [1, 2] and sorted(second["train"]) == [3, 4]
        assert_metrics_parity(ref, {"train": {**first["train"], **second["train"]}, "validation": {}}, TERMS)
