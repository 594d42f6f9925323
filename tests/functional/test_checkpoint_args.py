"""Checkpoint flags through the CLI: model flags that disagree with the checkpoint's saved ones,
--use-checkpoint-args, --pretrained-checkpoint, and --ckpt-format / foreign-format refusals."""
import os

import pytest

from .cli import losses, run_cli

BASE = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "500",
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--log-interval", "1", "--eval-iters", "0", "--lr", "2e-3", "--seed", "5"]
GELU = BASE + ["--openai-gelu"]

_saved = {}


def saved(tmp_path_factory):
    """A 4-iteration --openai-gelu run saved at iterations 2 and 4, its tracker set back to 2."""
    if not _saved:
        d = str(tmp_path_factory.mktemp("gelu"))
        _saved["losses"] = losses(run_cli(GELU + ["--train-iters", "4", "--save", d, "--save-interval", "2"]).stdout)
        with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write("2")  # a tracker edited by hand is obeyed: resume from iteration 2
        _saved["dir"] = d
    return _saved


def error_line(proc):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.slow
def test_model_flag_differing_from_the_checkpoint_is_an_error(tmp_path_factory):
    ref = saved(tmp_path_factory)
    line = error_line(run_cli(BASE + ["--train-iters", "4", "--load", ref["dir"]], check=False))
    assert "--openai-gelu is 'not given' here but 'given' in the checkpoint" in line
    line = error_line(run_cli(GELU + ["--train-iters", "4", "--load", ref["dir"], "--hidden-size", "64"],
                              check=False))
    assert "--hidden-size is 64 here but 32" in line


@pytest.mark.slow
def test_use_checkpoint_args_resumes_with_the_saved_flags(tmp_path_factory):
    ref = saved(tmp_path_factory)
    # neither --openai-gelu nor the sizes on the command line: all from the checkpoint
    argv = [a for a in BASE if a not in ("--hidden-size", "32")] + ["--train-iters", "4"]
    out = losses(run_cli(argv + ["--load", ref["dir"], "--use-checkpoint-args"]).stdout)
    assert out == {3: ref["losses"][3], 4: ref["losses"][4]}


@pytest.mark.slow
def test_pretrained_checkpoint_starts_at_iteration_0_from_its_weights(tmp_path, tmp_path_factory):
    ref = saved(tmp_path_factory)
    empty = str(tmp_path / "new")
    proc = run_cli(GELU + ["--train-iters", "2", "--load", empty, "--save", empty,
                           "--pretrained-checkpoint", ref["dir"]])
    assert "starting from --pretrained-checkpoint" in proc.stdout
    finetune = losses(run_cli(GELU + ["--train-iters", "2", "--load", ref["dir"], "--finetune"]).stdout)
    assert losses(proc.stdout) == finetune and sorted(finetune) == [1, 2]
    # a second start finds its own checkpoint under --load and resumes from it instead
    again = run_cli(GELU + ["--train-iters", "3", "--load", empty, "--pretrained-checkpoint", ref["dir"]])
    assert sorted(losses(again.stdout)) == [3]


def test_other_ckpt_formats_are_refused():
    line = error_line(run_cli(BASE + ["--train-iters", "1", "--ckpt-format", "torch"], check=False))
    assert "--ckpt-format torch is not supported" in line and "torch_dist" in line
    run_cli(BASE + ["--train-iters", "1", "--ckpt-format", "torch_dist", "--auto-detect-ckpt-format"])


def test_megatron_lm_checkpoint_is_refused(tmp_path):
    os.makedirs(tmp_path / "iter_0000010" / "mp_rank_00")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("10")
    line = error_line(run_cli(BASE + ["--train-iters", "1", "--load", str(tmp_path), "--auto-detect-ckpt-format"],
                              check=False))
    assert "Megatron-LM 'torch' checkpoint" in line and "--ckpt-format torch_dist" in line
