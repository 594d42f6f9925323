"""HuggingFace conversion of what Megatron-LM's recipes train (issue 31): a model trained with
--apply-layernorm-1p (norm weights stored as w - 1) gives transformers' logits; a model with a NullTokenizer
never writes an end-of-sequence id outside its vocabulary (a Qwen2-MoE model without tokenizer files came
back with eos_token_id = vocab size)."""
import json
import os
import sys
import types

import pytest
import torch

from tests.harness import spawn

from .cli import REPO, run_cli
from .test_conversion import _convert
from .test_conversion_untied import IDS, SHAPES, TINY, _ours, _tensors, _to_hf, _to_ours

transformers = pytest.importorskip("transformers")


def test_layernorm_1p_model_gives_transformers_logits(tmp_path):
    ckpt, hf = str(tmp_path / "ck"), str(tmp_path / "hf")
    run_cli(TINY + SHAPES["llama"] + ["--apply-layernorm-1p", "--save", ckpt])
    args, tensors = _tensors(ckpt)
    assert args["model"]["layernorm_zero_centered_gamma"]
    norm = tensors["decoder.final_layernorm.weight"]
    assert norm.abs().max() < 0.1  # w - 1: started at 0, two small steps
    assert _convert()(_to_hf(ckpt, hf)) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, local_files_only=True).eval()
    assert torch.equal(model.state_dict()["model.norm.weight"], norm + 1)
    with torch.no_grad():
        ref = model(torch.tensor(IDS)).logits
    (ours,) = spawn(1, _ours, ckpt)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)


def _hf_tokenizer():
    sys.path.insert(0, os.path.join(REPO, "tools", "checkpoint"))
    import hf_tokenizer
    return hf_tokenizer


def test_null_tokenizer_ids_stay_inside_the_vocabulary(tmp_path, capsys):
    from tests.unit.test_qwen2_moe_conversion import tiny_qwen2_moe
    hf0, ours, hf1 = (str(tmp_path / n) for n in ("hf0", "ours", "hf1"))
    model = tiny_qwen2_moe()
    assert model.config.eos_token_id is None
    model.save_pretrained(hf0)  # no tokenizer files, no end-of-sequence id
    assert _convert()(_to_ours(hf0, ours)) == 0
    training = _tensors(ours)[0]["training"]
    # the NullTokenizer recorded fills the model's 100 ids: 0..98 and end-of-document 99
    from megatron.training.tokenizer import build_tokenizer
    tok = build_tokenizer(types.SimpleNamespace(**{**dict.fromkeys(("vocab_file", "merge_file", "tokenizer_model")),
                                                   **training}))
    assert (training["null_vocab_size"], tok.vocab_size, tok.eod) == (99, 100, 99)
    assert _convert()(_to_hf(ours, hf1)) == 0
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(hf1, name)
        if os.path.exists(path):
            assert json.load(open(path)).get("eos_token_id") is None, name  # none in, none out (was 100)
    # a NullTokenizer whose end-of-document lies past the model's vocabulary: not written, said once
    capsys.readouterr()
    special = _hf_tokenizer().to_hf({"tokenizer_type": "NullTokenizer", "null_vocab_size": 100}, str(tmp_path), 100)
    assert special == {} and "eos_token_id 100 is outside the model's vocabulary (100 ids)" in capsys.readouterr().err
    assert _hf_tokenizer().to_hf({"tokenizer_type": "NullTokenizer", "null_vocab_size": 100}, str(tmp_path), 101) == \
        {"eos_token_id": 100}
