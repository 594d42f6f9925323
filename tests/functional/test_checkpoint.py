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
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8",
    "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "8",
    "--train-iters", "5", "--log-interval", "1", "--eval-iters", "0", "--lr", "2e-3",
    "--lr-warmup-iters", "2", "--seed", "7", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
    "--group-query-attention", "--num-query-groups", "4", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--make-vocab-size-divisible-by", "160"]
DISTOPT = ["--use-distributed-optimizer", "--ddp-bucket-size", "20000"]
# saving layout; with pipelining add "--pipeline-model-parallel-size", "2" here (nproc 8)
SAVE_LAYOUT = (4, ["--tensor-model-parallel-size", "2"] + DISTOPT)
LOAD_LAYOUTS = {
    "tp1": (1, []),
    "tp4": (4, ["--tensor-model-parallel-size", "4"]),
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
