"""Checkpoints through the CLI: exact resume, resharding to other layouts, atomic saves,
and clear errors for missing, truncated or foreign checkpoints."""
import os

import pytest
import torch

from .cli import losses, run_cli

ITERS = 8
BASE = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", str(ITERS), "--log-interval", "1", "--eval-iters", "0",
        "--lr", "2e-3", "--lr-warmup-iters", "2", "--seed", "7"]  # dropout on: RNG must resume too

_straight = {}


def straight(tmp_path_factory):
    """The uninterrupted single-process run (its losses and its final checkpoint)."""
    if not _straight:
        d = str(tmp_path_factory.mktemp("straight"))
        _straight["losses"] = losses(run_cli(BASE + ["--save", d]).stdout)
        _straight["dir"] = d
    return _straight


def params(root):
    """{key: param piece data} of the tracker's checkpoint (single-rank saves)."""
    it = int(open(os.path.join(root, "latest_checkpointed_iteration.txt")).read())
    payload = torch.load(os.path.join(root, f"iter_{it:07d}", "rank_00000.pt"), weights_only=True)
    return {(p["key"], p["state"]): p["data"] for p in payload["pieces"]}


@pytest.mark.slow
def test_resume_is_bitwise_identical(tmp_path, tmp_path_factory):
    ref = straight(tmp_path_factory)
    d = str(tmp_path / "ck")
    first = losses(run_cli(BASE + ["--save", d, "--save-interval", "2", "--exit-interval", str(ITERS // 2)]).stdout)
    assert sorted(first) == list(range(1, ITERS // 2 + 1))
    second = losses(run_cli(BASE + ["--save", d, "--load", d]).stdout)
    assert sorted(second) == list(range(ITERS // 2 + 1, ITERS + 1))
    assert {**first, **second} == ref["losses"]  # the logged 7 digits, every iteration
    a, b = params(ref["dir"]), params(d)
    assert a.keys() == b.keys()
    for k in a:  # and the final weights and Adam moments bit for bit
        assert torch.equal(a[k], b[k]), k


# Llama-style (SwiGLU fc1 split with stride 2, GQA, untied output) with vocabulary padding
# that depends on TP (1000 -> 1120 at TP 1, 1280 at TP 2 and 4).
RESHARD = BASE[:BASE.index("--num-layers")] + [
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8",
    "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "8",
    "--train-iters", "5", "--log-interval", "1", "--eval-iters", "0", "--lr", "2e-3",
    "--lr-warmup-iters", "2", "--seed", "7", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
    "--group-query-attention", "--num-query-groups", "4", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--make-vocab-size-divisible-by", "160"]
DISTOPT = ["--use-distributed-optimizer", "--ddp-bucket-size", "20000"]
SAVE_LAYOUT = (8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"] + DISTOPT)
LOAD_LAYOUTS = {
    "tp1": (1, []),
    "tp4": (4, ["--tensor-model-parallel-size", "4"]),
    "pp4": (4, ["--pipeline-model-parallel-size", "4"]),
    "dp4-distopt": (4, DISTOPT),
}
_saved = {}


def saved_at_3(tmp_path_factory):
    """Train 5 iterations at the saving layout, keeping the checkpoint of iteration 3."""
    if not _saved:
        d = str(tmp_path_factory.mktemp("reshard"))
        nproc, flags = SAVE_LAYOUT
        out = losses(run_cli(RESHARD + flags + ["--save", d, "--save-interval", "3"], nproc=nproc).stdout)
        with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write("3")  # the tracker names the checkpoint to load: go back to iteration 3
        _saved.update(dir=d, losses=out)
    return _saved


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LOAD_LAYOUTS))
def test_checkpoint_loads_into_another_layout(layout, tmp_path_factory):
    ref = saved_at_3(tmp_path_factory)
    nproc, flags = LOAD_LAYOUTS[layout]
    got = losses(run_cli(RESHARD + flags + ["--load", ref["dir"]], nproc=nproc).stdout)
    assert sorted(got) == [4, 5]
    # iteration 4 only runs forward on the loaded weights: float reordering only
    for it, tol in ((4, 1e-5), (5, 1e-4)):  # 5 also needs the Adam moments to have moved
        want = ref["losses"][it]
        rel = abs(got[it] - want) / abs(want)
        assert rel <= tol, f"{layout}: iteration {it} loss {got[it]} vs uninterrupted {want} ({rel:.2e})"


@pytest.mark.slow
def test_kill_during_save_keeps_last_good_checkpoint(tmp_path, tmp_path_factory):
    ref = straight(tmp_path_factory)
    d = str(tmp_path / "ck")
    env = {"MEGATRON_DEBUG_FAULT": "ckpt.rank_file.after:4:0"}  # kill -9 after the rank file of iteration 4
    proc = run_cli(BASE + ["--save", d, "--save-interval", "2"], check=False, env=env)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert open(os.path.join(d, "latest_checkpointed_iteration.txt")).read() == "2"
    assert os.path.isdir(os.path.join(d, "iter_0000004.tmp"))
    got = losses(run_cli(BASE + ["--save", d, "--load", d, "--exit-interval", "4"]).stdout)
    assert got == {3: ref["losses"][3], 4: ref["losses"][4]}
    assert open(os.path.join(d, "latest_checkpointed_iteration.txt")).read() == "4"
    assert sorted(os.listdir(d)) == ["iter_0000002", "iter_0000004", "latest_checkpointed_iteration.txt"]


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path):
    import signal
    import subprocess
    import sys

    from .cli import REPO
    d = str(tmp_path / "ck")
    args = list(BASE)
    args[args.index("--train-iters") + 1] = "100000"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "pretrain_gpt.py"] + args + ["--save", d, "--exit-signal-handler"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "iteration        2/" in line:
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "on SIGTERM" in out
    it = int(open(os.path.join(d, "latest_checkpointed_iteration.txt")).read())
    assert it >= 2 and f"iteration {it:8d}/" in "".join(lines) + out


def _truncate(root):
    f = os.path.join(root, "iter_0000008", "rank_00000.pt")
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)


def _foreign(root):
    os.makedirs(root)
    open(os.path.join(root, "config.json"), "w").write("{}")


ERRORS = {
    "missing directory": (lambda d: None, "no such checkpoint directory"),
    "empty directory": (lambda d: os.makedirs(d), "latest_checkpointed_iteration.txt is missing"),
    "huggingface directory": (_foreign, "looks like a HuggingFace model"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_unusable_checkpoint_directory_is_a_clear_error(case, tmp_path):
    from megatron.core.checkpointing import CheckpointError, find_checkpoint
    make, expected = ERRORS[case]
    d = str(tmp_path / "ck")
    make(d)
    with pytest.raises(CheckpointError, match=expected):
        find_checkpoint(d)


@pytest.mark.slow
def test_damaged_or_mismatched_checkpoint_is_one_line_error(tmp_path, tmp_path_factory):
    import shutil
    d = str(tmp_path / "ck")
    shutil.copytree(straight(tmp_path_factory)["dir"], d)
    # another model size: names the flag and both values (checked against the saved arguments first)
    bigger = list(BASE)
    bigger[bigger.index("--hidden-size") + 1] = "128"
    proc = run_cli(bigger + ["--load", d], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "--hidden-size is 128 here but 64 in the checkpoint" in proc.stderr, proc.stderr
    _truncate(d)
    proc = run_cli(BASE + ["--load", d], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "truncated" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_finetune_and_no_load_optim(tmp_path_factory):
    d = straight(tmp_path_factory)["dir"]
    args = list(BASE)
    args[args.index("--train-iters") + 1] = "9"
    out = run_cli(args + ["--load", d, "--no-load-optim", "--no-load-rng"]).stdout
    assert sorted(losses(out)) == [9] and "optimizer state NOT loaded" in out  # iteration kept
    args[args.index("--train-iters") + 1] = "2"
    out = run_cli(args + ["--load", d, "--finetune"]).stdout
    assert sorted(losses(out)) == [1, 2] and "at iteration 0, 0 consumed samples" in out
