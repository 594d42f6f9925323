"""--eod-mask-loss --reset-position-ids --reset-attention-mask through the CLI (mock samples end in
end-of-document padding, so every flag changes the run)."""
import pytest

from .cli import losses, run_cli

BASE = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "500", "--num-layers", "2",
        "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "64", "--micro-batch-size", "2",
        "--global-batch-size", "4", "--train-iters", "2", "--log-interval", "1", "--eval-iters", "0",
        "--lr", "2e-3", "--seed", "5"]
FLAGS = ["--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask"]


@pytest.mark.parametrize("pos", ["learned_absolute", "rope"])
def test_all_eod_flags_train(pos):
    plain = losses(run_cli(BASE + ["--position-embedding-type", pos]).stdout)
    flagged = losses(run_cli(BASE + FLAGS + ["--position-embedding-type", pos]).stdout)
    assert sorted(flagged) == [1, 2] and all(v == v for v in flagged.values())
    assert flagged[1] != plain[1]  # fewer loss terms: the masked predictions are out of the mean


def test_document_masks_refuse_a_backend_that_cannot_mask():
    proc = run_cli(BASE + ["--dataloader-inter-document-masking", "--attention-backend", "flash"], check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert errors == ["error: --attention-backend flash cannot mask documents (flash-attn's flash_attn_func takes "
                      "the causal mask only) and --dataloader-inter-document-masking needs it; use "
                      "--attention-backend auto, sdpa or unfused"], errors
