"""examples/deepseek/train_deepseek_v3_tiny_cpu.sh trains: two iterations on the embedded corpus log the token,
MTP and balance losses, finite, and the start-up line names the group-limited routing and the layer pattern."""
import math
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_deepseek_recipe_trains_two_iterations(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["bash", "examples/deepseek/train_deepseek_v3_tiny_cpu.sh", "--train-iters", "2",
                           "--log-interval", "1", "--eval-iters", "0", "--global-batch-size", "4",
                           "--tensorboard-dir", str(tmp_path / "tb")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "top-4 from 2 of 4 groups, layers 0111 (1: MoE)" in proc.stdout
    for term in ("lm loss", "mtp_1 loss", "load_balancing_loss"):
        values = [float(v) for v in re.findall(re.escape(term) + r": ([0-9.E+-]+) \|", proc.stdout)]
        assert len(values) == 2 and all(math.isfinite(v) for v in values), (term, values)
