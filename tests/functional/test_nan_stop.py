"""--check-for-nan-in-loss-and-grad (on by default): a diverging run (an absurd learning rate)
stops at the first NaN iteration with one line and exit code 17, and no checkpoint of it is written."""
import os

import pytest

from .cli import run_cli

ARGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--num-layers", "2",
        "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16", "--micro-batch-size", "2",
        "--global-batch-size", "4", "--train-iters", "8", "--log-interval", "1", "--eval-iters", "0",
        "--lr", "1e30", "--min-lr", "0", "--lr-warmup-iters", "0"]


@pytest.mark.parametrize("nproc,layout,where", [
    (1, [], "stage 0, first seen on rank 0: lm loss nan"),
    pytest.param(2, ["--pipeline-model-parallel-size", "2"], "stage 1, first seen on rank 1: lm loss nan",
                 marks=pytest.mark.slow),
], ids=["one-process", "pp2"])
def test_nan_stops_before_the_save_of_its_iteration(tmp_path, nproc, layout, where):
    ckpt = tmp_path / "ckpt"
    proc = run_cli(ARGS + layout + ["--save", str(ckpt), "--save-interval", "1"], nproc=nproc, check=False)
    assert proc.returncode in (17, 1), proc.stderr[-3000:]  # torchrun reports a failed worker as 1
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and f"{os.sep}megatron{os.sep}" not in proc.stderr, proc.stderr[-3000:]  # no traceback of
    # ours (torchrun prints its own ChildFailedError for the worker's exit code)
    assert errors[0].startswith("error: iteration 2: the loss is not finite on the last pipeline stage"), errors
    assert where in errors[0] and "gradient norm (global over all ranks) is nan" in errors[0]
    assert sorted(p.name for p in ckpt.iterdir()) == ["iter_0000001", "latest_checkpointed_iteration.txt"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    if nproc == 1:
        assert proc.returncode == 17


def test_no_check_trains_on_and_counts_the_nan_iterations(tmp_path):
    proc = run_cli(ARGS + ["--train-iters", "4", "--no-check-for-nan-in-loss-and-grad"], check=True)
    assert "number of nan iterations:   1" in proc.stdout and "lm loss: NAN" in proc.stdout
