"""The model families, in one table: each module of this package is one family (its preset, layer switches
and HuggingFace adapter, family.py), and FAMILIES lists them. tools/checkpoint/convert.py finds a HuggingFace
model's family by its config.json model_type (by_hf_type) and one of our models' by its layer switches
(for_model); adding a family is one module and one entry here (docs/model_families.md).
"""
from ...errors import CheckpointError
from . import bert, deepseek_v3, gpt, llama, mixtral, qwen2_moe, qwen3
from .family import Family, layer_switches

FAMILIES = {f.name: f for f in (gpt.FAMILY, llama.FAMILY, qwen3.FAMILY, mixtral.FAMILY, qwen2_moe.FAMILY,
                                deepseek_v3.FAMILY, bert.FAMILY)}
_BY_HF_TYPE = {f.hf_model_type: f for f in FAMILIES.values()}

__all__ = ["FAMILIES", "Family", "by_hf_type", "for_model", "hf_types", "layer_switches"]


def hf_types(model_type):
    """config.json model_types convert.py reads for --model-type `model_type` ("GPT" or "BERT")."""
    return tuple(f.hf_model_type for f in FAMILIES.values() if f.model_type == model_type)


def by_hf_type(hf_model_type):
    """The family of a HuggingFace config.json's model_type (KeyError if none)."""
    return _BY_HF_TYPE[hf_model_type]


def for_model(args, model_type="GPT"):
    """The family whose layer switches our model args `args` have; one CheckpointError line when none does
    (a combination no family here holds, e.g. QK-norm with experts)."""
    switches = layer_switches(args, model_type)
    found = [f for f in FAMILIES.values() if f.holds_switches(switches)]
    if not found:
        shown = ", ".join(f"{k} {v}" for k, v in switches.items())
        raise CheckpointError(f"no HuggingFace family we convert to has this model's layers ({shown}); families: "
                              + "; ".join(f"{f.title} ({f.hf_model_type})" for f in FAMILIES.values()))
    return found[0]  # one at most: no two families' switches overlap (tests/unit/test_model_families.py)
