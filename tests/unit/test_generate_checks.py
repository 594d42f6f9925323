"""tools/generate.py's input checks (issue 41, item 7): each sampling flag is checked by its own rule (the error
names the one that fails), and a text prompt on a checkpoint trained without a text tokenizer is one line."""
import importlib.util
import os
import types

import pytest

from megatron.core.errors import ConfigError
from megatron.core.ranges import check_ranges
from megatron.training.tokenizer.simple import ByteTokenizer, NullTokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _generate():
    spec = importlib.util.spec_from_file_location("generate", os.path.join(REPO, "tools", "generate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generate()
GOOD = dict(max_new_tokens=4, temperature=None, top_k=0, top_p=1.0, inference_max_seq_length=None, seed=1)


@pytest.mark.parametrize("name", sorted(GEN.SAMPLING_RULES))
@pytest.mark.parametrize("value", [-1, float("nan"), float("inf")])
def test_every_sampling_flag_is_named_alone(name, value):
    a = types.SimpleNamespace(**{**GOOD, name: value})
    with pytest.raises(ConfigError) as e:
        check_ranges(a, GEN.SAMPLING_RULES, lambda n: "--" + n.replace("_", "-"))
    flag = "--" + name.replace("_", "-")
    assert str(e.value).startswith(flag + " must be") and all(
        "--" + other.replace("_", "-") + " " not in str(e.value) for other in GEN.SAMPLING_RULES if other != name)


def test_the_defaults_pass():
    check_ranges(types.SimpleNamespace(**GOOD), GEN.SAMPLING_RULES, lambda n: n)


def _args(**kw):
    return types.SimpleNamespace(**{"prompt_ids": None, "prompt": None, "prompt_file": None, **kw})


def test_a_text_prompt_without_a_text_tokenizer_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^--prompt: the checkpoint was trained with NullTokenizer"):
        GEN.prompts_of(_args(prompt="def main("), NullTokenizer(64))
    path = tmp_path / "p.txt"
    path.write_text("1 2\nhello\n")
    with pytest.raises(ConfigError, match=r"line 2: the checkpoint was trained with NullTokenizer"):
        GEN.prompts_of(_args(prompt_file=str(path)), NullTokenizer(64))


def test_null_tokenizer_text_of_ids_and_text_tokenizers_still_work():
    assert GEN.prompts_of(_args(prompt="3 4 5"), NullTokenizer(64)) == [[3, 4, 5]]
    assert GEN.prompts_of(_args(prompt="ab"), ByteTokenizer()) == [[97, 98]]
