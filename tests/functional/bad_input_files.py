"""Damaged inputs for test_bad_inputs.py that take more than a line to make: HuggingFace MoE folders
(Mixtral, Qwen2-MoE, Hub layout of one tensor per expert) missing a tensor, naming more experts than
they hold, or with damaged bytes; a MoE checkpoint whose index files are garbage; a dataset written
by ByteTokenizer with its tokenizer record, and a SentencePiece model of another vocabulary."""
import json
import os

import torch

from tests.data_utils import make_sentencepiece, preprocess, sample_texts, write_jsonl

from .cli import run_cli

H, F, LAYERS, HEADS, VOCAB, EXPERTS = 16, 24, 1, 2, 64, 2


def _llama_part(g):
    t = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,), "lm_head.weight": (VOCAB, H)}
    for i in range(LAYERS):
        s = f"model.layers.{i}."
        t.update({s + f"self_attn.{p}_proj.weight": (H, H) for p in "qkvo"})
        t.update({s + "input_layernorm.weight": (H,), s + "post_attention_layernorm.weight": (H,)})
    return {k: torch.randn(shape, generator=g) * 0.05 for k, shape in t.items()}


def _experts(g, kind):
    """Per-expert tensors of the Hub layout (Mixtral: w1 gate, w3 up, w2 down; Qwen2-MoE: named)."""
    t = {}
    for i in range(LAYERS):
        if kind == "mixtral":
            x = f"model.layers.{i}.block_sparse_moe."
            t[x + "gate.weight"] = (EXPERTS, H)
            for e in range(EXPERTS):
                t.update({f"{x}experts.{e}.w1.weight": (F, H), f"{x}experts.{e}.w3.weight": (F, H),
                          f"{x}experts.{e}.w2.weight": (H, F)})
        else:
            x = f"model.layers.{i}.mlp."
            t.update({x + "gate.weight": (EXPERTS, H), x + "shared_expert_gate.weight": (1, H),
                      x + "shared_expert.gate_proj.weight": (F, H), x + "shared_expert.up_proj.weight": (F, H),
                      x + "shared_expert.down_proj.weight": (H, F)})
            t.update({f"model.layers.{i}.self_attn.{p}_proj.bias": (H,) for p in "qkv"})
            for e in range(EXPERTS):
                t.update({f"{x}experts.{e}.gate_proj.weight": (F, H), f"{x}experts.{e}.up_proj.weight": (F, H),
                          f"{x}experts.{e}.down_proj.weight": (H, F)})
    return {k: torch.randn(shape, generator=g) * 0.05 for k, shape in t.items()}


def _config(kind, experts):
    c = {"vocab_size": VOCAB, "hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
         "num_key_value_heads": HEADS, "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "hidden_act": "silu",
         "tie_word_embeddings": False, "num_experts_per_tok": 1, "model_type": kind}
    if kind == "mixtral":
        return dict(c, intermediate_size=F, num_local_experts=experts)
    return dict(c, intermediate_size=F, moe_intermediate_size=F, shared_expert_intermediate_size=F,
                num_experts=experts, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                qkv_bias=True, norm_topk_prob=True)


def write_hf_moe(folder, kind, config_experts=EXPERTS, drop=None, damage=False):
    """A HuggingFace `kind` ('mixtral' or 'qwen2_moe') folder of EXPERTS experts' weights whose config.json
    names config_experts; `drop`: a tensor name left out; `damage`: 4 KiB of 0xff over the weights' bytes."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(0)
    tensors = {**_llama_part(g), **_experts(g, kind)}
    tensors.pop(drop, None)
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(_config(kind, config_experts), f)
    path = os.path.join(folder, "model.safetensors")
    save_file(tensors, path)
    if damage:  # every 4 bytes 0xffffffff: a float32 NaN where a weight was
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\xff" * 4096)


def write_garbage_index(root, moe_args):
    """A MoE checkpoint (one iteration of moe_args, saved) whose index/*.json files hold garbage."""
    run_cli(moe_args + ["--train-iters", "1", "--save", root])
    index = os.path.join(root, "iter_0000001", "index")
    for name in os.listdir(index):
        path = os.path.join(index, name)
        if os.path.isdir(path):  # rng/: read after the tensors
            continue
        with open(path, "wb") as f:
            f.write(b"this is not an index file " * 8)


def write_byte_data_and_sentencepiece(d):
    """{d}/bytes_text_document (tools/preprocess_data.py, ByteTokenizer: ids below 257, its record beside),
    {d}/sp2000/spm.model (SentencePiece, 2,000 pieces: every byte id is in its range) and
    {d}/sp_text_document (preprocessed with it)."""
    texts = sample_texts(200_000)
    model = make_sentencepiece(os.path.join(d, "sp2000"), texts, vocab_size=2000)
    jsonl = write_jsonl(os.path.join(d, "texts.jsonl"), texts[:40])
    preprocess(jsonl, os.path.join(d, "bytes"), ["--tokenizer-type", "ByteTokenizer"])
    preprocess(jsonl, os.path.join(d, "sp"), ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", model])
