"""Reading a local HuggingFace model directory as it is on disk, damage included.

The tensors are read from the weight files themselves, not through from_pretrained (which
fills missing weights with random ones and only warns). Every defect is one CheckpointError:
no config.json or one that is not JSON or lacks a key the family needs, no weight file,
a truncated or corrupt file, a shard the index names but that is missing.
"""
import json
import os

import torch

from .pieces import CheckpointError


def read_config_json(path, required):
    """config.json of `path` as a dict; its model_type must be a key of `required` ({model_type: the keys
    without which transformers would silently use its defaults}), and it must hold those keys."""
    f = os.path.join(path, "config.json")
    if not os.path.isfile(f):
        raise CheckpointError(f"--load-dir {path}: no config.json, not a HuggingFace model directory")
    try:
        with open(f) as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{f}: unreadable ({e})") from None
    kind = cfg.get("model_type") if isinstance(cfg, dict) else None
    if kind not in required:
        raise CheckpointError(f"{f}: model_type {kind!r} is not one we convert here ({', '.join(required)})")
    missing = [k for k in required[kind] if k not in cfg]
    if missing:
        raise CheckpointError(f"{f} lacks {', '.join(missing)} (needed for a {kind} model)")
    return cfg


def _load_file(f):
    if not os.path.isfile(f):
        raise CheckpointError(f"{f}: missing (named by the weight index)")
    try:
        if f.endswith(".safetensors"):
            from safetensors.torch import load_file
            return load_file(f)
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise several types for a damaged file
        raise CheckpointError(f"{f}: truncated or corrupt ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def read_state_dict(path):
    """{name: tensor} from model.safetensors, pytorch_model.bin or their sharded index."""
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if os.path.isfile(os.path.join(path, single)):
            return _load_file(os.path.join(path, single))
        if os.path.isfile(os.path.join(path, index)):
            try:
                with open(os.path.join(path, index)) as fh:
                    shards = sorted(set(json.load(fh)["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as e:
                raise CheckpointError(f"{os.path.join(path, index)}: unreadable ({e})") from None
            sd = {}
            for shard in shards:
                sd.update(_load_file(os.path.join(path, shard)))
            return sd
    raise CheckpointError(f"--load-dir {path}: no model.safetensors or pytorch_model.bin (weights missing)")


def add_to_saved_files(path, extra):
    """Write `extra` tensors into the weights save_pretrained wrote at `path`: into model.safetensors, or as
    one more shard named in model.safetensors.index.json."""
    if not extra:
        return
    from safetensors.torch import load_file, save_file
    extra = {k: v.detach().clone().contiguous() for k, v in extra.items()}  # copies: no storage shared
    single, index = os.path.join(path, "model.safetensors"), os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        save_file({**load_file(single), **extra}, single, metadata={"format": "pt"})
        return
    with open(index) as fh:
        idx = json.load(fh)
    shard = "model-extra.safetensors"
    save_file(extra, os.path.join(path, shard), metadata={"format": "pt"})
    idx["weight_map"].update(dict.fromkeys(extra, shard))
    idx.setdefault("metadata", {})["total_size"] = idx.get("metadata", {}).get("total_size", 0) + sum(
        v.numel() * v.element_size() for v in extra.values())
    with open(index, "w") as fh:
        json.dump(idx, fh, indent=2)
