"""Under torchrun the configuration is resolved for the real world size: without
--global-batch-size the global batch is micro batch x DP, as the help says; and a configuration
error is printed once (by rank 0), while every rank exits 2."""
import re

from .cli import losses, run_cli

TINY = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--num-layers", "1",
        "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16", "--micro-batch-size", "2",
        "--train-iters", "2", "--eval-iters", "0", "--log-interval", "1"]


def test_default_global_batch_is_micro_times_dp():
    proc = run_cli(TINY, nproc=2, timeout=300)
    assert sorted(losses(proc.stdout)) == [1, 2]
    assert "batch: micro 2 x DP 2 x accumulation 1 = global 4" in proc.stdout
    assert re.findall(r"global batch size:\s+(\d+)", proc.stdout) == ["4", "4"]


def test_config_error_is_printed_once_under_torchrun():
    proc = run_cli(TINY + ["--hidden-size", "30", "--num-attention-heads", "4"], nproc=2, check=False, timeout=300)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: --hidden-size (30) is not divisible by --num-attention-heads (4); pick a head "
                      "count that divides it"], proc.stderr
    assert "exitcode  : 2" in proc.stderr  # torchrun's report of the (first) failed rank
