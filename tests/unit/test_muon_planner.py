"""The planner knows Muon: one momentum buffer instead of two moments on the hidden matrices, their
Newton-Schulz FLOPs in the optimizer step (about 2 x steps x (2 m n^2 + n^3) each), and the TP modes'
and the distributed optimizer's traffic in its time (tests/distributed/test_muon_traffic.py checks the
bytes against a real step)."""
from megatron.core.optimizer.muon import MuonConfig
from megatron.training.planner import make_cluster, predict
from megatron.training.planner.muon_cost import _ns_time

GPT_1B = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
          "--max-position-embeddings", "2048", "--vocab-size", "50257", "--global-batch-size", "64",
          "--micro-batch-size", "2", "--bf16"]


def test_muon_holds_less_and_spends_its_newton_schulz_in_the_step():
    cluster = make_cluster("H100-SXM", 8)
    adam = predict(GPT_1B + ["--tensor-model-parallel-size", "2"], cluster)
    muon = predict(GPT_1B + ["--tensor-model-parallel-size", "2", "--optimizer", "muon"], cluster)
    assert muon.memory_bytes < adam.memory_bytes
    assert muon.step.optimizer > adam.step.optimizer
    assert muon.step.pipeline == adam.step.pipeline  # the forward and backward do not change
    # the layer-wise distributed optimizer shares the Newton-Schulz over the 4 DP ranks
    shared = predict(GPT_1B + ["--tensor-model-parallel-size", "2", "--optimizer", "muon",
                               "--use-distributed-optimizer"], cluster)
    assert shared.step.optimizer < muon.step.optimizer


def test_newton_schulz_time_follows_its_flops():
    cluster, cfg = make_cluster("H100-SXM", 1), MuonConfig()
    small, large = _ns_time(cluster, 2048, 2048, None, 1, cfg, 2), _ns_time(cluster, 8192, 2048, None, 1, cfg, 2)
    # 2 m n^2 + n^3 at m = 4n against m = n: 9 n^3 / 3 n^3 (the GEMMs' efficiencies aside)
    assert 2 < large / small < 4
