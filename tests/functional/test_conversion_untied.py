"""Conversion of models our trainer makes: untied GPT-2, Llama and Qwen3 shapes to HF and back (logits
within 1e-4, tensors exact), every unused tensor refused, every shape HF cannot hold refused
in one line, a damaged HF directory refused in one line, bos/eos/pad ids kept."""
import json
import os

import pytest
import torch

from megatron.core.checkpointing import CheckpointReader, find_checkpoint, save_global_checkpoint, whole_piece
from megatron.core.models import families
from tests.harness import spawn

from .cli import run_cli
from .test_conversion import _convert

transformers = pytest.importorskip("transformers")

VOCAB = 100  # NullTokenizer --vocab-size 100: ids 0..99, eod 100, model vocabulary 101
IDS = [[5, 17, 99, 3, 100, 42, 7]]
TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--micro-batch-size", "2", "--train-iters", "2", "--mock-data", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(VOCAB), "--eval-iters", "0", "--untie-embeddings-and-output-weights"]
SHAPES = {"gpt2": [], "llama": ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                                "--group-query-attention", "--num-query-groups", "2"],
          "qwen3": families.FAMILIES["qwen3"].flags() + ["--group-query-attention", "--num-query-groups", "2",
                                                         "--kv-channels", "12"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{family: checkpoint dir} of tiny untied models trained (2 iterations) by pretrain_gpt.py."""
    root = tmp_path_factory.mktemp("untied")
    out = {}
    for family, flags in SHAPES.items():
        out[family] = str(root / family)
        run_cli(TINY + flags + ["--save", out[family]])
    return out


def _ours(groups, ckpt):
    from megatron.core.inference.generation import forward_with_cache, load_model
    from megatron.core.transformer.kv_cache import KVCache
    torch.set_num_threads(1)
    model, _, _ = load_model(ckpt, groups, torch.device("cpu"))
    return forward_with_cache(model, torch.tensor(IDS), KVCache())


def _tensors(ckpt):
    reader = CheckpointReader(find_checkpoint(ckpt))
    return reader.metadata["args"], {k: reader.global_tensor(k) for k in reader.keys("param")}


def _refused(capsys, argv, *fragments):
    """convert.py argv exits 2 with one `error:` line holding every fragment, no traceback."""
    capsys.readouterr()
    assert _convert()(argv) == 2
    err = capsys.readouterr().err
    lines = [s for s in err.splitlines() if s.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def _to_hf(src, dst):
    return ["--loader", "megatron", "--saver", "hf", "--load-dir", src, "--save-dir", dst]


def _to_ours(src, dst):
    return ["--loader", "hf", "--saver", "megatron", "--load-dir", src, "--save-dir", dst]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen3"])
def test_untied_logits_match_hf_and_convert_back(trained, family, tmp_path):
    hf, back = str(tmp_path / "hf"), str(tmp_path / "back")
    assert _convert()(_to_hf(trained[family], hf)) == 0
    cfg = json.load(open(os.path.join(hf, "config.json")))
    assert cfg["model_type"] == family and cfg["tie_word_embeddings"] is False
    assert cfg["eos_token_id"] == VOCAB  # the NullTokenizer's eod
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, local_files_only=True).eval()
    assert not model.lm_head.weight.equal(model.get_input_embeddings().weight)
    with torch.no_grad():
        ref = model(torch.tensor(IDS)).logits
    (ours,) = spawn(1, _ours, trained[family])
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)

    assert _convert()(_to_ours(hf, back)) == 0
    (_, a), (b_args, b) = _tensors(trained[family]), _tensors(back)
    assert a.keys() == b.keys() and "output_layer.weight" in b
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert b_args["training"]["tokenizer_type"] == "NullTokenizer"
    assert b_args["training"]["null_vocab_size"] == VOCAB
    assert b_args["training"]["hf_special_tokens"]["eos_token_id"] == VOCAB


@pytest.mark.slow
def test_unused_tensors_refused_both_ways(trained, tmp_path, capsys):
    args, tensors = _tensors(trained["gpt2"])
    extra = str(tmp_path / "extra")
    save_global_checkpoint(extra, [whole_piece(k, "param", v) for k, v in
                                   dict(tensors, **{"adapter.weight": torch.zeros(2)}).items()], args)
    _refused(capsys, _to_hf(extra, str(tmp_path / "x")), "adapter.weight", "does not use")

    hf = str(tmp_path / "hf")
    assert _convert()(_to_hf(trained["gpt2"], hf)) == 0
    from safetensors.torch import load_file, save_file
    f = os.path.join(hf, "model.safetensors")
    sd = load_file(f)
    save_file(dict(sd, **{"transformer.h.0.attn.lora_A": torch.zeros(3)}), f)
    _refused(capsys, _to_ours(hf, str(tmp_path / "y")), "h.0.attn.lora_A")


UNSUPPORTED = {  # model args changed -> a fragment of the message
    "gqa-learned": (dict(num_attention_heads=4, kv_channels=2), "grouped-query attention"),
    "rmsnorm-gpt2": (dict(normalization="RMSNorm"), "RMSNorm"),
    "post-norm": (dict(post_norm=True), "post-norm"),
    "swiglu-gpt2": (dict(swiglu=True), "SwiGLU"),
    "no-bias-gpt2": (dict(add_bias_linear=False), "--disable-bias-linear"),
    "layernorm-llama": (dict(position_embedding_type="rope", swiglu=True), "LayerNorm with SwiGLU"),
    "gelu-llama": (dict(position_embedding_type="rope", normalization="RMSNorm"), "RMSNorm with GeLU"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_shape_is_one_line(case, tmp_path, capsys):
    change, fragment = UNSUPPORTED[case]
    model = dict(num_layers=1, hidden_size=8, num_attention_heads=2, num_query_groups=2, kv_channels=4,
                 position_embedding_type="learned_absolute", normalization="LayerNorm", swiglu=False,
                 post_norm=False, add_bias_linear=True, untie_embeddings_and_output_weights=False,
                 vocab_size=10, max_position_embeddings=8, norm_epsilon=1e-5, hidden_dropout=0.0,
                 attention_dropout=0.0, ffn_hidden_size=16, rotary_base=10000)
    model.update(change)
    ckpt = str(tmp_path / "c")
    save_global_checkpoint(ckpt, [whole_piece("word_embeddings.weight", "param", torch.zeros(10, 8))],
                           {"model": model, "training": {}})
    line = _refused(capsys, _to_hf(ckpt, str(tmp_path / "hf")), fragment)
    assert "HF GPT-2 holds" in line or "HF Llama holds" in line


def test_hf_damage_and_layout_flags_are_one_line(trained, tmp_path, capsys):
    hf = str(tmp_path / "hf")
    assert _convert()(_to_hf(trained["gpt2"], hf)) == 0
    _refused(capsys, _to_hf(trained["gpt2"], str(tmp_path / "z")) + ["--target-tensor-parallel-size", "2"],
             "--target-tensor-parallel-size 2", "--saver megatron")
    from safetensors.torch import load_file, save_file
    f = os.path.join(hf, "model.safetensors")
    sd = load_file(f)
    save_file({k: v for k, v in sd.items() if k != "transformer.h.1.mlp.c_fc.weight"}, f)
    _refused(capsys, _to_ours(hf, str(tmp_path / "a")), "h.1.mlp.c_fc.weight", "missing weights")
    save_file(sd, f)
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
    _refused(capsys, _to_ours(hf, str(tmp_path / "b")), "model.safetensors", "truncated or corrupt")
    cfg_file = os.path.join(hf, "config.json")
    cfg = json.load(open(cfg_file))
    json.dump({k: v for k, v in cfg.items() if k != "n_layer"}, open(cfg_file, "w"))
    _refused(capsys, _to_ours(hf, str(tmp_path / "c")), "config.json lacks n_layer")
    open(cfg_file, "w").write("{not json")
    _refused(capsys, _to_ours(hf, str(tmp_path / "d")), "config.json", "unreadable")


def test_bos_eos_pad_survive_hf_ours_hf(tmp_path):
    hf, ours, back = (str(tmp_path / n) for n in ("hf", "ours", "back"))
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, max_position_embeddings=16, bos_token_id=5,
                                   eos_token_id=6, pad_token_id=7)
    transformers.LlamaForCausalLM(cfg).save_pretrained(hf)
    assert _convert()(_to_ours(hf, ours)) == 0
    assert _convert()(_to_hf(ours, back)) == 0
    got = json.load(open(os.path.join(back, "config.json")))
    assert (got["bos_token_id"], got["eos_token_id"], got["pad_token_id"]) == (5, 6, 7)
