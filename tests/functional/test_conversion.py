"""HuggingFace GPT-2 / Llama / Qwen3 <-> our checkpoints: exact round trip, same logits at TP 1 and 2,
and tools/generate.py's greedy output equal to transformers' generate()."""
import importlib.util
import os

import pytest
import torch

from tests.harness import spawn

from .cli import REPO, run_cli

transformers = pytest.importorskip("transformers")

VOCAB, PROMPT, NEW = 1000, [[5, 17, 256, 3, 999, 42]], 8


def _convert():
    spec = importlib.util.spec_from_file_location("convert", os.path.join(REPO, "tools", "checkpoint", "convert.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def tiny_hf(kind, path):
    """A small randomly initialised HF model (norms perturbed too), saved to `path`."""
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4)
        model = transformers.GPT2LMHeadModel(cfg)
    elif kind == "llama":  # GQA: 4 query heads in 2 groups; untied output; non-default rope base
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       rope_theta=5000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    else:  # Qwen3: Llama's shape plus per-head q/k norms (perturbed below), head_dim 24 != hidden / heads
        cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                       max_position_embeddings=64, rope_theta=5000.0, rms_norm_eps=1e-6,
                                       tie_word_embeddings=False)
        model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.generation_config.eos_token_id = None  # greedy to the last token, no early stop
    model.generation_config.pad_token_id = 0
    model.eval().save_pretrained(path)
    return model


def _our_logits_and_greedy(groups, ckpt, ids, new):
    from megatron.core.inference.generation import forward_with_cache, generate, load_model
    from megatron.core.transformer.kv_cache import KVCache
    torch.set_num_threads(1)
    model, _, _ = load_model(ckpt, groups, torch.device("cpu"))
    with torch.no_grad():
        plain = model(torch.tensor(ids))  # the training forward: [b, s, V_padded / TP]
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region
        plain = gather_from_tensor_model_parallel_region(plain, groups.tp)[..., :VOCAB]
        cached = forward_with_cache(model, torch.tensor(ids), KVCache())
    return plain, cached, generate(model, torch.tensor(ids), new).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3"])
def test_hf_round_trip_logits_and_greedy_generation(kind, tmp_path):
    hf_dir, ours, back = (str(tmp_path / n) for n in ("hf", "ours", "back"))
    model = tiny_hf(kind, hf_dir)
    convert = _convert()
    assert convert(["--loader", "hf", "--saver", "megatron", "--load-dir", hf_dir, "--save-dir", ours,
                    "--target-tensor-parallel-size", "2"]) == 0
    assert convert(["--loader", "megatron", "--saver", "hf", "--load-dir", ours, "--save-dir", back]) == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(back, local_files_only=True)
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{kind}: {k} differs after the round trip"

    with torch.no_grad():
        ref = model(torch.tensor(PROMPT)).logits
    want = model.generate(torch.tensor(PROMPT), max_new_tokens=NEW, do_sample=False)[0].tolist()
    with torch.no_grad():  # the tokens compare as integers: on any CPU only where no two logits nearly tie
        top = model(torch.tensor([want])).logits[0, len(PROMPT[0]) - 1:-1].topk(2, dim=-1).values
    assert (top[:, 0] - top[:, 1] > 2 * (1e-5 + 1e-5 * top[:, 0].abs())).all(), "a near tie: another seed"
    for tp in (1, 2):
        for plain, cached, greedy in spawn(tp, _our_logits_and_greedy, ours, PROMPT, NEW, tp=tp):
            torch.testing.assert_close(plain, ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(cached, ref, rtol=1e-5, atol=1e-5)
            assert greedy[0] == want, f"{kind} TP{tp}: {greedy[0]} vs transformers {want}"

    # the CLI as a user runs it
    out = run_cli(["--load", ours, "--prompt-ids", " ".join(map(str, PROMPT[0])), "--max-new-tokens", str(NEW)],
                  script="tools/generate.py").stdout
    line = next(s for s in out.splitlines() if s.startswith("generated ids: "))
    assert [int(t) for t in line.split(": ")[1].split()] == want[len(PROMPT[0]):]
