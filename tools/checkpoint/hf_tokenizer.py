"""The tokenizer and its special ids across a HuggingFace conversion.

Our checkpoint stores the trainer's tokenizer flags (training args: tokenizer_type,
vocab_file, merge_file, tokenizer_model, null_vocab_size), i.e. paths to files, and no
bos/pad (the trainer only uses the tokenizer's eod). An HF directory holds the files under
fixed names and the ids in config.json / generation_config.json. So:
  ours -> HF: the files are copied under HF's names; eos = the tokenizer's eod unless the
    checkpoint came from HF (then its recorded bos/eos/pad, none if it had none); an id outside the
    model's vocabulary is never written (HF would index past the embedding); megatron_tokenizer.json
    keeps the tokenizer type for the way back (Byte and Null have no files).
  HF -> ours: the files are copied into <save-dir>/tokenizer/ and the flags point at them;
    config.json's bos/eos/pad ids are kept in the training args as hf_special_tokens. A model with no
    tokenizer files gets the NullTokenizer that fills its vocabulary V: ids 0..V-2 and end-of-document
    V-1 (--vocab-size V-1), so that training it on goes on with the model's own vocabulary.
"""
import json
import os
import shutil
import sys
from types import SimpleNamespace

SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id")
MARKER = "megatron_tokenizer.json"
# our flag -> the file name HF tools look for, per tokenizer type
HF_NAMES = {"SentencePieceTokenizer": {"tokenizer_model": "tokenizer.model"},
            "GPTSentencePieceTokenizer": {"tokenizer_model": "tokenizer.model"},
            "HuggingFaceTokenizer": {"tokenizer_model": "tokenizer.json"},
            "GPT2BPETokenizer": {"vocab_file": "vocab.json", "merge_file": "merges.txt"}}


def _source(flag, path):
    """A folder given as HuggingFaceTokenizer --tokenizer-model holds tokenizer.json."""
    if flag == "tokenizer_model" and path and os.path.isdir(path):
        return os.path.join(path, "tokenizer.json")
    return path


def to_hf(training, hf_dir, vocab_size=None):
    """Copy the checkpoint's tokenizer files into hf_dir; -> {bos/eos/pad_token_id: id} for config.json,
    without ids at or above vocab_size (the model's unpadded vocabulary), with a warning for each."""
    special = _special_ids(training, hf_dir)
    out = {k: v for k, v in special.items() if vocab_size is None or v is None or 0 <= v < vocab_size}
    for k in special.keys() - out.keys():
        print(f"warning: the tokenizer's {k} {special[k]} is outside the model's vocabulary ({vocab_size} ids): "
              "not written to config.json", file=sys.stderr)
    return out


def _special_ids(training, hf_dir):
    from megatron.training.tokenizer import TokenizerError, build_tokenizer
    kind = training.get("tokenizer_type")
    if kind is None:
        return {}
    flags = HF_NAMES.get(kind, {})
    sources = {flag: _source(flag, training.get(flag)) for flag in flags}
    lost = [p or f"(no {f})" for f, p in sources.items() if not (p and os.path.isfile(p))]
    if lost:
        print(f"warning: tokenizer file {', '.join(lost)} not found: the HF model is written without its "
              "tokenizer", file=sys.stderr)
    else:
        for flag, name in flags.items():
            shutil.copyfile(sources[flag], os.path.join(hf_dir, name))
    null = training.get("null_vocab_size", training.get("vocab_size"))  # older checkpoints: vocab_size
    with open(os.path.join(hf_dir, MARKER), "w") as f:
        json.dump({"tokenizer_type": kind, "null_vocab_size": null if kind == "NullTokenizer" else None}, f)
    if "hf_special_tokens" in training:  # converted from HF: its ids, none where it had none
        return dict(training["hf_special_tokens"])
    if lost:
        return {}
    args = dict(tokenizer_type=kind, null_vocab_size=null, **{f: sources[f] for f in flags})
    args.update({f: None for f in ("vocab_file", "merge_file", "tokenizer_model") if f not in args})
    try:
        return {"eos_token_id": build_tokenizer(SimpleNamespace(**args)).eod}
    except TokenizerError:
        return {}


def from_hf(hf_dir, save_dir, cfg):
    """Training args for a checkpoint converted from hf_dir (config.json dict `cfg`): the
    tokenizer flags (files copied into save_dir/tokenizer/) and hf_special_tokens."""
    marker = os.path.join(hf_dir, MARKER)
    recorded = json.load(open(marker)) if os.path.isfile(marker) else {}
    kind = recorded.get("tokenizer_type")
    if kind is None:
        present = [k for k, names in HF_NAMES.items() if k != "GPTSentencePieceTokenizer"
                   and all(os.path.isfile(os.path.join(hf_dir, n)) for n in names.values())]
        kind = present[0] if present else "NullTokenizer"
    training = {"tokenizer_type": kind, "vocab_file": None, "merge_file": None, "tokenizer_model": None,
                "null_vocab_size": None}
    if kind == "NullTokenizer":  # recorded by to_hf, else the one filling the model's vocabulary
        training["null_vocab_size"] = recorded.get("null_vocab_size") or cfg["vocab_size"] - 1
    names = HF_NAMES.get(kind, {})
    if names:
        dest = os.path.abspath(os.path.join(save_dir, "tokenizer"))
        os.makedirs(dest, exist_ok=True)
        for flag, name in names.items():
            src = os.path.join(hf_dir, name)
            if not os.path.isfile(src):
                from megatron.core.checkpointing import CheckpointError
                raise CheckpointError(f"{hf_dir}/{MARKER} names a {kind} but {name} is missing")
            shutil.copyfile(src, os.path.join(dest, name))
            training[flag] = os.path.join(dest, name)
    training["hf_special_tokens"] = {k: cfg[k] for k in SPECIAL if cfg.get(k) is not None}
    return training
