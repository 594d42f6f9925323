"""bench/overhead.py at tiny CPU shapes, one process each: the plain GPT, Llama and MoE loops (and the
compiled plain GPT) start from our weights and agree with ours at the first step (token loss and
grad norm, fp32), and the results are written as markdown and JSON."""
import json
import os
import subprocess
import sys

import pytest
import torch

from bench import pair

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "256", "--micro-batch", "2",
        "--num-micro", "2", "--rounds", "1", "--steps-per-round", "1", "--warmup", "1", "--threads", "1"]
ARCHS = {"gpt": [], "llama": ["--kv-heads", "2", "--ffn", "128"], "moe": ["--experts", "4", "--ffn", "128"]}


def run_overhead(tmp_path, argv):
    out = tmp_path / "overhead.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "overhead.py"), *argv, "--out", str(out)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "overhead.json").read_text())
    # what bench/gpu_suite.py's report reads: the table, a "ratio" line, one RESULT line per model
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("ratio ") for ln in lines)
    results = [json.loads(ln[len("RESULT "):]) for ln in lines if ln.startswith("RESULT ")]
    assert len(results) == len(res["rows"]) and all(r["ms_per_step"] > 0 for r in results)
    assert out.read_text().count("\n| ") == len(res["rows"]) + 1  # header + a row per model
    return res


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_plain_model_is_ours_at_the_first_step(arch, tmp_path):
    res = run_overhead(tmp_path, ["--arch", arch, *TINY, *ARCHS[arch]])
    rows = res["rows"]
    assert set(rows) == {"ours", "plain"} and rows["ours"]["params"] == rows["plain"]["params"]
    first = [(rows[n]["first_loss"], rows[n]["first_grad_norm"]) for n in ("ours", "plain")]
    assert pair.disagreement(*first, torch.float32) is None
    assert res["shape"]["arch"] == arch and rows["ours"]["model_tflops"] > 0 and rows["ours"]["mfu"] is None


@pytest.mark.slow
def test_compiled_plain_model_is_ours_at_the_first_step(tmp_path):
    """torch.compile on CPU (inductor builds C++): about a minute of CPU time."""
    res = run_overhead(tmp_path, ["--arch", "gpt", *TINY, "--models", "ours", "--compile"])
    rows = res["rows"]
    assert set(rows) == {"ours", "compiled"}
    first = [(rows[n]["first_loss"], rows[n]["first_grad_norm"]) for n in ("ours", "compiled")]
    assert pair.disagreement(*first, torch.float32) is None
