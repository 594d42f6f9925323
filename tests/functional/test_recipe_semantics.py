"""Training semantics of Megatron-LM's recipe flags through the CLI (issue 31): the step batch-size schedule
(consumed samples, learning rate and global batch per iteration, written out below from Megatron-LM's
rule) and the loss averaging with and without --calculate-per-token-loss, each equal to one process in
data- and pipeline-parallel layouts."""
import re

import pytest

from .cli import run_metrics
from .test_parity import assert_metrics_parity

BASE = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "200", "--num-layers", "2",
        "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
        "--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "linear", "--seed", "3"]
GBS_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| global batch size:\s+(\d+) \|")


def test_step_batch_size_schedule_as_megatron_counts_it_in_any_dp():
    # thresholds in tokens at --seq-length 16: samples 0, 6 and 16
    args = BASE + ["--step-batch-size-schedule", "0:4 96:8 256:16", "--train-iters", "6", "--lr-warmup-iters", "2",
                   "--lr-decay-iters", "5"]
    proc, ref = run_metrics(args)
    _, dp2 = run_metrics(args, nproc=2)
    for run in (ref, dp2):
        train = run["train"]
        # batch before iteration k from the samples consumed so far: 0 -> 4, 4 -> 4, 8 -> 8, 16 -> 16, ...
        assert [train[k]["consumed_samples"] for k in range(1, 7)] == [4, 8, 16, 32, 48, 64]
        # warm-up 2 x 16 and decay 5 x 16 samples (the last batch size); the schedule counts samples:
        # 0, 4/32, 8/32, 16/32, 32/32 of the peak, then 1e-4 + (1 - 16/48) x 9e-4
        lrs = [train[k]["lr"] for k in range(1, 7)]
        assert lrs == pytest.approx([0.0, 1.25e-4, 2.5e-4, 5e-4, 1e-3, 7e-4], rel=1e-12)
    assert {int(k): int(v) for k, v in GBS_RE.findall(proc.stdout)} == {1: 4, 2: 4, 3: 8, 4: 16, 5: 16, 6: 16}
    assert_metrics_parity(ref, dp2)


LOSS = BASE + ["--global-batch-size", "8", "--train-iters", "4", "--eod-mask-loss"]  # microbatches count unequally
_one_process = {}


def one_process(per_token):
    if per_token not in _one_process:
        _one_process[per_token] = run_metrics(LOSS + (["--calculate-per-token-loss"] if per_token else []))[1]
    return _one_process[per_token]


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("layout", [["--pipeline-model-parallel-size", "2"], []], ids=["pp2", "dp2"])
def test_loss_averaging_is_the_same_in_every_layout(per_token, layout):
    args = LOSS + (["--calculate-per-token-loss"] if per_token else [])
    assert_metrics_parity(one_process(per_token), run_metrics(args + layout, nproc=2)[1])


def test_per_token_loss_changes_the_gradient_where_microbatches_count_unequally():
    default, per_token = one_process(False), one_process(True)
    # iteration 1's loss is reported per token either way; its gradient is not the same
    assert default["train"][1]["losses"] == per_token["train"][1]["losses"]
    assert default["train"][1]["grad_norm"] != per_token["train"][1]["grad_norm"]


MODEL_FLAGS = BASE + ["--global-batch-size", "8", "--train-iters", "4", "--num-layers", "4", "--normalization",
                      "RMSNorm", "--apply-layernorm-1p", "--num-experts", "4", "--moe-router-topk", "2",
                      "--moe-layer-freq", "([1]+[0])*2", "--moe-router-dtype", "fp64", "--moe-aux-loss-coeff", "1e-2",
                      "--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp", "moe",
                      "--decoupled-lr", "3e-3", "--lr-warmup-iters", "1"]


@pytest.mark.parametrize("layout", [["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"],
                                    ["--expert-model-parallel-size", "2"]], ids=["pp2-zb-h1", "dp2-ep2"])
def test_recipe_model_flags_are_the_same_in_every_layout(layout):
    """--apply-layernorm-1p (1 + w on the zero-bubble graph split), --moe-router-dtype, --recompute-modules
    mlp moe and --decoupled-lr, each equal to one process."""
    if "ref" not in _one_process:
        _one_process["ref"] = run_metrics(MODEL_FLAGS)[1]
    assert_metrics_parity(_one_process["ref"], run_metrics(MODEL_FLAGS + layout, nproc=2)[1],
                          terms=("lm loss", "load_balancing_loss"))
