"""BERT on real text, as a user runs it: a WordPiece vocab trained here, preprocess_data.py
--split-sentences, then pretrain_bert.py on one process and on TP2 x PP2 x DP2 (same losses),
exact resume from a checkpoint, and one-line errors for inputs BERT cannot use."""
import pytest

from tests.data_utils import run_tool, sample_texts, write_jsonl

from .cli import run_cli, term_losses
from .test_parity import assert_parity

ITERS = 12
MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
         "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(ITERS), "--log-interval", "1",
         "--eval-iters", "1", "--eval-interval", "6", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--lr", "3e-3", "--lr-warmup-iters", "2", "--seed", "11"]


@pytest.fixture(scope="module")
def bert_data(tmp_path_factory):
    """(folder, data flags): stdlib source split into sentences under a WordPiece vocab trained on it."""
    d = tmp_path_factory.mktemp("bert-data")
    jsonl = write_jsonl(d / "corpus.jsonl", sample_texts(300_000))
    proc = run_tool("train_tokenizer.py", ["--input", jsonl, "--tokenizer-type", "BertWordPieceLowerCase",
                                           "--model-prefix", d / "wp", "--vocab-size", "800"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    tok = ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", str(d / "wp.vocab.txt")]
    proc = run_tool("preprocess_data.py", ["--input", jsonl, "--output-prefix", d / "corpus", "--split-sentences",
                                           "--workers", "2", *tok])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d, tok + ["--data-path", str(d / "corpus_text_sentence"), "--split", "70,30,0"]


@pytest.mark.slow
def test_real_text_tp2_pp2_dp2_matches_one_process_and_learns(bert_data):
    d, data = bert_data
    ref = run_cli(MODEL + data + ["--data-cache-path", str(d / "c1")], script="pretrain_bert.py").stdout
    got = run_cli(MODEL + data + ["--data-cache-path", str(d / "c8"), "--tensor-model-parallel-size", "2",
                                  "--pipeline-model-parallel-size", "2"], nproc=8, script="pretrain_bert.py").stdout
    for term in ("lm loss", "sop loss"):
        want = term_losses(ref, term)
        assert sorted(want) == list(range(1, ITERS + 1))
        assert_parity(want, term_losses(got, term))
    lm = term_losses(ref, "lm loss")
    assert lm[ITERS] < lm[1] - 0.3, f"the masked-LM loss did not fall: {lm}"
    assert "validation loss at iteration 12 | lm loss value" in got


@pytest.mark.slow
def test_resume_gives_the_same_losses(bert_data, tmp_path):
    d, data = bert_data
    flags = MODEL + data + ["--data-cache-path", str(d / "c1"), "--save", str(tmp_path / "ck"), "--save-interval", "3"]
    full = run_cli(flags, script="pretrain_bert.py").stdout
    run_cli(flags[:] + ["--exit-interval", "6"], script="pretrain_bert.py")
    resumed = run_cli(flags + ["--load", str(tmp_path / "ck")], script="pretrain_bert.py").stdout
    for term in ("lm loss", "sop loss"):
        want, got = term_losses(full, term), term_losses(resumed, term)
        assert sorted(got) == list(range(7, ITERS + 1)), f"resume did not start at 7: {sorted(got)}"
        assert all(got[i] == want[i] for i in got), f"{term}: {got} vs {want}"


@pytest.mark.parametrize("flags,message", [
    (["--tokenizer-type", "ByteTokenizer"], "needs a WordPiece vocabulary"),
    (["--position-embedding-type", "rope"], "learned absolute positions"),
    (["--mask-prob", "1.5"], "--mask-prob"),
])
def test_bad_bert_input_is_one_line_error(bert_data, flags, message):
    d, data = bert_data
    args = MODEL + data + ["--data-cache-path", str(d / "c1")]
    if flags[0] == "--tokenizer-type":
        args = [a for a in args if a not in ("BertWordPieceLowerCase", "--tokenizer-type", "--vocab-file")
                and not a.endswith("wp.vocab.txt")]
    proc = run_cli(args + flags, script="pretrain_bert.py", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_document_per_line_data_is_refused_with_the_fix(bert_data, tmp_path):
    d, data = bert_data
    tok = data[:data.index("--data-path")]
    jsonl = write_jsonl(tmp_path / "one.jsonl", ["A single sentence per document.", "Another one here."])
    proc = run_tool("preprocess_data.py", ["--input", jsonl, "--output-prefix", tmp_path / "docs", *tok])
    assert proc.returncode == 0, proc.stderr[-2000:]
    args = MODEL + tok + ["--data-path", str(tmp_path / "docs_text_document"), "--data-cache-path", str(tmp_path)]
    proc = run_cli(args, script="pretrain_bert.py", check=False)
    assert proc.returncode == 2 and "--split-sentences" in proc.stderr, proc.stderr[-2000:]
