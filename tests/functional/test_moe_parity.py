"""MoE through the CLI: every expert-parallel layout gives the per-iteration losses (the token loss
and both router losses) and grad norms of one process, and a checkpoint saved at TP2 x EP2 x PP2
(with the expert bias) continues at one process with the same losses. fp32, dropout 0, dropless.

Each layout proves something the others do not:
  EP2 x DP2, alltoall, distributed optimizer, grouped GEMM: token counts then tokens exchanged;
      expert grads reduced over expert-DP and sharded by the distributed optimizer
  EP2 x DP2, group-limited routing (one group per EP rank), scaling factor, a dense first layer: the
      routing and the layer pattern the same on every rank
  TP2 x EP2, allgather, sequence parallel: experts split over TP, tokens gathered over TP and EP
  TP2 x EP2, alltoall, sequence parallel, --moe-router-force-load-balancing: each token's random logits the
      same on every layout (force_balance.py), the router trained straight through them
  PP2 x EP2, alltoall, replicated optimizer, capacity 1.0 (drop by position): router losses from
      both stages; the expert grad norm summed over the EP group; the same pairs dropped as one process
  TP2 x PP2 x EP2 (8 ranks), expert bias: saves at iteration 1 (the bias, +-rate after one update,
      is 0 again after two at this rate); one process loads it, bias included, and goes on identically
  CP2 x EP2, alltoall, Llama-style, seq_aux_loss, expert bias: the router's counts summed over CP,
      each CP rank's losses its part of the micro-batch's, the bias's load counts summed over DP x CP,
      EP carved out of DP x CP (CP2 x DP2 and TP2 x CP2 x EP2
      run by hand: notes/17-18-moecp.md)
"""
import pytest

from megatron.core.checkpointing import CheckpointReader, find_checkpoint

from .cli import run_metrics
from .test_parity import BASE, LLAMA, assert_metrics_parity

ITERS = 4
FLAGS = BASE + ["--train-iters", str(ITERS), "--eval-iters", "0"]  # the last occurrence of a flag wins
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "96", "--moe-aux-loss-coeff", "1e-2",
       "--moe-z-loss-coeff", "1e-3", "--disable-bias-linear"]
TERMS = ("lm loss", "load_balancing_loss", "z_loss")
EP2 = ["--expert-model-parallel-size", "2"]

BIAS = ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.05"]  # a rate that moves the routing
# DeepSeek-V3's routing: sigmoid, top-2 of 4 experts from 1 of 2 groups (= one EP rank: device-limited), scaled
# by 2.5, the first layer dense
GROUPS = ["--moe-router-score-function", "sigmoid", "--moe-router-num-groups", "2", "--moe-router-group-topk", "1",
          "--moe-router-topk-scaling-factor", "2.5", "--moe-layer-freq", "([0]+[1])"]
CAPACITY = ["--moe-expert-capacity-factor", "1.0", "--moe-token-drop-policy", "position"]
_ref = {}


def reference(extra=()):
    """The one-process run's metrics for MOE + extra model flags (run once each)."""
    key = tuple(extra)
    if key not in _ref:
        _ref[key] = run_metrics(FLAGS + MOE + list(extra))[1]
        assert sorted(_ref[key]["train"]) == list(range(1, ITERS + 1))
    return _ref[key]


LAYOUTS = {  # name: (ranks, layout flags, model flags the reference shares)
    "ep2xdp2-alltoall-distopt-grouped": (4, EP2 + ["--moe-token-dispatcher-type", "alltoall",
                                                   "--use-distributed-optimizer", "--moe-grouped-gemm"], []),
    "ep2xdp2-group-limited-dense-first": (4, EP2 + ["--moe-token-dispatcher-type", "alltoall"], GROUPS),
    "tp2xep2-allgather-sp": (4, EP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"], []),
    "pp2xep2-alltoall-capacity": (4, EP2 + ["--pipeline-model-parallel-size", "2",
                                            "--moe-token-dispatcher-type", "alltoall"], CAPACITY),
    "tp2xep2-alltoall-sp-forced": (4, EP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                             "--moe-token-dispatcher-type", "alltoall"],
                                   ["--moe-router-force-load-balancing"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_moe_layout_matches_one_process(name):
    nproc, flags, model = LAYOUTS[name]
    got = run_metrics(FLAGS + MOE + model + flags, nproc=nproc)[1]
    assert_metrics_parity(reference(model), got, TERMS)


@pytest.mark.slow
def test_checkpoint_saved_at_tp2_pp2_ep2_continues_at_one_process(tmp_path):
    ref = reference(BIAS)
    d = str(tmp_path / "ck")
    first = run_metrics(FLAGS + MOE + BIAS + EP2 + ["--tensor-model-parallel-size", "2",
                                                    "--pipeline-model-parallel-size", "2",
                                                    "--moe-token-dispatcher-type", "alltoall", "--save", d,
                                                    "--save-interval", "1", "--exit-interval", "1"], nproc=8)[1]
    reader = CheckpointReader(find_checkpoint(d))
    biases = {key: reader.index[(key, "buffer")] for key in reader.keys("buffer")}
    assert sorted(biases) == [f"decoder.layers.{i}.mlp.router.expert_bias" for i in (0, 1)]
    for key, pieces in biases.items():  # one writer of the 4 ranks holding each layer; it moved
        assert len(pieces) == 1 and pieces[0]["data"].abs().min() > 0, (key, pieces)
    second = run_metrics(FLAGS + MOE + BIAS + ["--load", d])[1]
    assert sorted(first["train"]) == [1] and sorted(second["train"]) == [2, 3, 4]
    got = {"train": {**first["train"], **second["train"]}, "validation": {}}
    assert_metrics_parity(ref, got, TERMS)


@pytest.mark.slow
def test_moe_with_context_parallel_matches_one_process():
    model = LLAMA + ["--moe-router-load-balancing-type", "seq_aux_loss", "--moe-router-enable-expert-bias",
                     "--moe-router-bias-update-rate", "0.05"]  # a rate that moves the routing within 4 iterations
    got = run_metrics(FLAGS + MOE + model + EP2 + ["--context-parallel-size", "2", "--moe-token-dispatcher-type",
                                                    "alltoall"], nproc=4)[1]
    assert_metrics_parity(reference(model), got, TERMS)
