"""tools/generate.py after the README's own flow: pretrain_gpt.py --save (the embedded recipe,
its SentencePiece tokenizer), then generate from that checkpoint with that tokenizer; a prompt
file; the too-long and missing-tokenizer refusals; PP = 2 and TP = 2 give PP = 1's tokens."""
import importlib.util
import os

import pytest
import torch

from megatron.core.checkpointing import find_checkpoint, read_metadata
from megatron.core.errors import TokenizerError
from tests.harness import spawn

from .cli import REPO, run_cli

SEQ = 32
PROMPTS = ["def main(", "import os", "class A:"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A checkpoint of the no-data recipe, made tiny (2 layers, 2 iterations, a small corpus)."""
    root = tmp_path_factory.mktemp("readme")
    save = str(root / "ckpt")
    run_cli(["--save", save, "--train-iters", "2", "--num-layers", "2", "--hidden-size", "32",
             "--num-attention-heads", "4", "--seq-length", str(SEQ), "--micro-batch-size", "2",
             "--embedded-corpus-bytes", "300000", "--embedded-vocab-size", "400",
             "--data-cache-path", str(root / "cache"), "--eval-iters", "0"])
    return save


def _generate(args, nproc=1, check=True):
    return run_cli(args, nproc=nproc, script="tools/generate.py", check=check)


def _outputs(stdout):
    """[(generated ids, text)] in printed order."""
    lines = stdout.splitlines()
    ids = [[int(t) for t in s.split(": ", 1)[1].split()] for s in lines if s.startswith("generated ids: ")]
    texts = [s[len("text: "):] for s in lines if s.startswith("text: ")]
    return list(zip(ids, texts))


def _one_error_line(proc, *fragments):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [s for s in proc.stderr.splitlines() if s.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.slow
def test_readme_flow_prompt_file_and_parallel_layouts(ckpt, tmp_path):
    training = read_metadata(find_checkpoint(ckpt))["args"]["training"]
    assert training["tokenizer_type"] == "SentencePieceTokenizer"
    single = _outputs(_generate(["--load", ckpt, "--prompt", PROMPTS[0], "--max-new-tokens", "6"]).stdout)
    assert len(single) == 1 and single[0][1].startswith(PROMPTS[0]) and 1 <= len(single[0][0]) <= 6

    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS) + "\n")
    many = _outputs(_generate(["--load", ckpt, "--prompt-file", str(prompt_file), "--max-new-tokens", "6"]).stdout)
    assert len(many) == len(PROMPTS) and many[0] == single[0]
    assert [text[:len(p)] for (_, text), p in zip(many, PROMPTS)] == PROMPTS

    for layout in (["--pipeline-model-parallel-size", "2"], ["--tensor-model-parallel-size", "2"]):
        got = _outputs(_generate(["--load", ckpt, "--prompt-file", str(prompt_file), "--max-new-tokens", "6"]
                                 + layout, nproc=2).stdout)
        assert got == many, f"{layout}: {got} vs one process {many}"


@pytest.mark.slow
def test_refusals_are_one_line(ckpt):
    too_long = _generate(["--load", ckpt, "--prompt", PROMPTS[0], "--max-new-tokens", str(SEQ)], check=False)
    _one_error_line(too_long, f"exceeds the model's {SEQ} positions", "--max-new-tokens")
    negative_k = _generate(["--load", ckpt, "--prompt", PROMPTS[0], "--top-k", "-1"], check=False)
    _one_error_line(negative_k, "--top-k must be a non-negative")
    wrong_world = _generate(["--load", ckpt, "--prompt", "x", "--pipeline-model-parallel-size", "2"], check=False)
    _one_error_line(wrong_world, "launch exactly")

    model_file = read_metadata(find_checkpoint(ckpt))["args"]["training"]["tokenizer_model"]
    os.rename(model_file, model_file + ".away")
    try:
        gone = _generate(["--load", ckpt, "--prompt", PROMPTS[0]], check=False)
    finally:
        os.rename(model_file + ".away", model_file)
    _one_error_line(gone, "the checkpoint's tokenizer", model_file, "no such file")


def _greedy_then_stop_at_first(groups, ckpt):
    from megatron.core.inference.generation import generate, load_model
    torch.set_num_threads(1)
    model, _, _ = load_model(ckpt, groups, torch.device("cpu"))
    prompt = torch.tensor([[5, 6, 7]])
    free = generate(model, prompt, 5)
    return free.tolist(), generate(model, prompt, 5, eod=int(free[0, 3])).tolist()


@pytest.mark.slow
def test_stops_at_eod(ckpt):
    (free, stopped), = spawn(1, _greedy_then_stop_at_first, ckpt)
    assert len(free[0]) == 8 and stopped[0] == free[0][:4]


def _generate_module():
    spec = importlib.util.spec_from_file_location("generate", os.path.join(REPO, "tools", "generate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tokenizer_of_reads_both_vocab_size_keys_and_refuses_bert():
    tokenizer_of = _generate_module().tokenizer_of
    model = {"vocab_size": 51}
    for training in ({"tokenizer_type": "NullTokenizer", "null_vocab_size": 50},
                     {"tokenizer_type": "NullTokenizer", "vocab_size": 50}):  # before null_vocab_size
        assert tokenizer_of({"args": {"model": model, "training": training}}).eod == 50
    assert tokenizer_of({"args": {"model": model, "training": {"tokenizer_type": "ByteTokenizer"}}}).eod == 256
    with pytest.raises(TokenizerError, match="BERT tokenizer"):
        tokenizer_of({"args": {"model": model, "training": {"tokenizer_type": "BertWordPieceLowerCase"}}})
