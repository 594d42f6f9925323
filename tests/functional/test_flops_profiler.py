"""--flops-profiler-step through the real CLI (issue 47): at TP2 the logging rank prints the per-module table
once, its totals meet flops.py's model FLOPs (each rank half of them), TensorBoard and --log-metrics-jsonl get it
too; a value that names no iteration is one line, exit 2. tests/distributed/test_flops_profiler.py checks the
counter itself on GPT, Llama-style, MoE and MLA models."""
import json

from megatron.core.config import ConfigError
from megatron.training.config.arguments import parse_args
from megatron.training.config.logging_flags import check_flops_profiler

from .cli import run_cli
from .test_observability import scalars

TINY = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "500", "--num-layers", "2",
        "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "2",
        "--global-batch-size", "4", "--train-iters", "3", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0"]


def test_table_at_tp2_meets_the_model_flops_and_goes_to_tensorboard_and_jsonl(tmp_path):
    tb, jsonl = tmp_path / "tb", tmp_path / "m.jsonl"
    proc = run_cli(TINY + ["--tensor-model-parallel-size", "2", "--flops-profiler-step", "2",
                           "--tensorboard-dir", str(tb), "--log-metrics-jsonl", str(jsonl)], nproc=2, timeout=300)
    out = proc.stdout
    assert out.count("> flops profiler, iteration 2, rank 1 (step") == 1  # the logging rank's table, once
    (record,) = [r for r in map(json.loads, jsonl.read_text().splitlines()) if r["type"] == "flops_profile"]
    assert record["rank"] == 0 and record["iteration"] == 2
    assert record["rank_flops"] * 2 == record["world_flops"] == record["model_flops"]
    assert f"all 2 ranks {record['world_flops']}; flops.py's model FLOPs of the step {record['model_flops']} " \
           "(equal)" in out
    rows = {r["module"]: r for r in record["modules"]}
    qkv = rows["GPTModel.decoder.layers.0.self_attention.linear_qkv"]
    assert qkv["backward_flops"] == 2 * qkv["forward_flops"] > 0 and qkv["seconds"] > 0 and qkv["params"] > 0
    root = rows["GPTModel"]
    assert root["forward_flops"] + root["backward_flops"] == record["rank_flops"] and 0 < root["step_share"] <= 1
    tags = scalars(tb)
    assert 2 in tags["flops-profiler/total TFLOP/s"]
    assert 2 in tags["flops-profiler/GPTModel.decoder.layers.0.mlp.linear_fc1 time-ms"]


def test_a_step_outside_the_run_is_one_line_and_exit_2(tmp_path):
    for step, words in ((0, "not an iteration of this run (1 to 3)"), (4, "not an iteration of this run")):
        cfg = parse_args(TINY + ["--flops-profiler-step", str(step)])[1]
        try:
            check_flops_profiler(cfg)
        except ConfigError as e:
            assert f"--flops-profiler-step {step}: {words}" in str(e)
        else:
            raise AssertionError(f"--flops-profiler-step {step} was accepted")
    proc = run_cli(TINY + ["--flops-profiler-step", "9"], check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --flops-profiler-step 9: not an iteration of this run (1 to 3); give one of them"]
    assert "Traceback" not in proc.stderr and "iteration " not in proc.stdout
