"""The planner knows Muon: one momentum buffer instead of two moments on the hidden matrices, their
Newton-Schulz FLOPs in the optimizer step (about 2 x steps x (2 m n^2 + n^3) each), and the TP modes'
and the distributed optimizer's traffic in its time (tests/distributed/test_muon_traffic.py checks the
bytes against a real step)."""
import json
import os
import subprocess
import sys

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


def test_the_gpu_suites_muon_step_runs_on_cpu():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "bench/muon_step.py", "--steps", "1", "--warmup", "0"], cwd=root,
                          env={**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln[7:]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert [r["name"] for r in rows] == ["optimizer step tiny adam", "optimizer step tiny muon"]
    assert rows[1]["ns_share"] > 0 and rows[1]["ns_ms"] > 0
