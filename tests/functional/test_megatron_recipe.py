"""A Megatron-LM user's recipe runs here as written (issue 14): the GPT-3 recipe's flag set, sizes scaled
down, parses and trains through the real CLI; the example recipes parse; the learning rate each
iteration runs at is Megatron-LM's, and survives skipped iterations and a resume."""
import os
import re
import subprocess

import pytest

from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate

from .cli import REPO, losses, run_cli

# examples/gpt3/train_gpt3_175b_distributed.sh's flags with tiny sizes; --bf16 for its --fp16 (CPU),
# --mock-data / NullTokenizer for its GPT-2 BPE data, and the flags other Megatron-LM recipes add
GPT3_RECIPE = [
    "--use-mcore-models", "--transformer-impl", "local",
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
    "--max-position-embeddings", "32", "--attention-backend", "auto", "--attention-softmax-in-fp32",
    "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2",
    "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--init-method-std", "0.006",
    "--clip-grad", "1.0", "--bf16", "--lr", "6.0e-5", "--lr-decay-style", "cosine", "--min-lr", "6.0e-6",
    "--lr-warmup-iters", "1", "--lr-decay-iters", "2",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--split", "949,50,1",
    "--log-interval", "1", "--save-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
    "--distributed-timeout-minutes", "10", "--exit-duration-in-mins", "230",
]
LR_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| learning rate: ([0-9.Ee+-]+) \|")
RECIPES = {"examples/gpt/train_gpt3_small.sh": 4, "examples/llama/train_llama_small.sh": 2,
           "examples/gpt/train_gpt3_small_muon.sh": 4}


def _lrs(stdout):
    return {int(m.group(1)): float(m.group(2)) for m in LR_RE.finditer(stdout)}


@pytest.mark.parametrize("script,world", sorted(RECIPES.items()))
def test_example_recipes_parse(script, world):
    out = subprocess.run(["bash", os.path.join(REPO, script)], env=dict(os.environ, PRINT_ARGS="1"),
                         capture_output=True, text=True, check=True).stdout
    model_cfg, train_cfg = parse_args(out.splitlines())
    resolve(model_cfg, train_cfg, world)
    validate(model_cfg, train_cfg, world)


def test_seed004_muon_recipe_parses_and_trains_on_cpu_at_a_tiny_size(tmp_path):
    script = os.path.join(REPO, "examples/moe/train_moe_seed004.sh")
    env = dict(os.environ, OPTIMIZER="muon", PRINT_ARGS="1")
    model_cfg, train_cfg = parse_args(subprocess.run(["bash", script], env=env, capture_output=True, text=True,
                                                     check=True).stdout.splitlines())
    assert train_cfg.optimizer == "muon" and model_cfg.num_experts == 8 and model_cfg.moe_grouped_gemm
    tiny = ["--num-layers", "1", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
            "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2",
            "--global-batch-size", "4", "--train-iters", "3", "--eval-iters", "0", "--log-interval", "1",
            "--tensorboard-dir", str(tmp_path / "tb")]
    env.pop("PRINT_ARGS")
    proc = subprocess.run(["bash", script, *tiny], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(losses(proc.stdout)) == [1, 2, 3] and "> optimizer: Muon on the 2-D hidden matrices" in proc.stdout


def test_slurm_recipe_is_valid_bash():
    subprocess.run(["bash", "-n", os.path.join(REPO, "examples/gpt/train_gpt_slurm.sbatch")], check=True)


def test_gpt3_recipe_trains_two_iterations(tmp_path):
    proc = run_cli(GPT3_RECIPE + ["--save", str(tmp_path / "ck")], nproc=2, pinned=False, timeout=300)
    assert sorted(losses(proc.stdout)) == [1, 2]
    # warm-up of one iteration: iteration 1 runs at 0, iteration 2 at the peak (Megatron-LM's schedule)
    assert _lrs(proc.stdout) == {1: 0.0, 2: 6.0e-5}
    assert os.path.isdir(tmp_path / "ck")


TINY = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--num-layers", "1",
        "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
        "--log-interval", "1", "--eval-iters", "0", "--lr", "1e-2", "--lr-warmup-iters", "4", "--train-iters", "8",
        "--hidden-dropout", "0", "--attention-dropout", "0"]
# fp16 at a loss scale of 2^20 overflows (and halves the scale) at iterations 1..4: those updates are skipped
SKIPPING = ["--fp16", "--initial-loss-scale", str(2.0 ** 20), "--hysteresis", "1"]
SKIPPED_RE = re.compile(r"iteration\s+(\d+)/.*?number of skipped iterations:\s+(\d+)")


def test_skipped_iterations_hold_the_schedule_across_a_resume(tmp_path):
    straight = run_cli(TINY + SKIPPING, pinned=False, timeout=300).stdout
    skipped = [int(it) for it, n in SKIPPED_RE.findall(straight) if int(n)]
    assert skipped == [1, 2, 3, 4]
    # iteration k runs after k - 1 - (skips before it) updates: step 0 through iteration 5, then (k - 5) / 4 x 1e-2
    assert _lrs(straight) == pytest.approx({1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 2.5e-3, 7: 5e-3, 8: 7.5e-3})
    ck = str(tmp_path / "ck")
    run_cli(TINY + SKIPPING + ["--save", ck, "--exit-interval", "3"], pinned=False, timeout=300)
    resumed = run_cli(TINY + SKIPPING + ["--save", ck, "--load", ck], pinned=False, timeout=300).stdout
    assert _lrs(resumed) == {k: v for k, v in _lrs(straight).items() if k > 3}
    assert losses(resumed) == pytest.approx({k: v for k, v in losses(straight).items() if k > 3}, rel=1e-5)


def test_exit_duration_saves_and_stops(tmp_path):
    ck = str(tmp_path / "ck")
    out = run_cli(TINY + ["--exit-duration-in-mins", "1e-6", "--save", ck], pinned=False, timeout=300).stdout
    assert sorted(losses(out)) == [1] and "--exit-duration-in-mins" in out
    assert any(name.startswith("iter_0000001") for name in os.listdir(ck))
