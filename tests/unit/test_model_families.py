"""The model-family table (megatron/core/models/families/): one family per HuggingFace model_type, no two
families holding the same layer switches, presets that are real flags, one line for a model no family holds."""
import itertools

import pytest

from megatron.core.checkpointing import CheckpointError
from megatron.core.models import families
from megatron.training.config.arguments import parse_args

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3"]
SWITCH_VALUES = {"encoder": (False, True), "attention": ("standard", "latent"), "qk_norm": (False, True),
                 "experts": (False, True), "shared_experts": (False, True),
                 "positions": ("rope", "learned_absolute")}


def test_every_switch_combination_has_at_most_one_family():
    assert set(families.layer_switches({})) == set(SWITCH_VALUES)
    held = set()
    for values in itertools.product(*SWITCH_VALUES.values()):
        switches = dict(zip(SWITCH_VALUES, values))
        owners = [f.name for f in families.FAMILIES.values() if f.holds_switches(switches)]
        assert len(owners) <= 1, f"{switches}: held by {owners}"
        held.update(owners)
    assert held == set(families.FAMILIES), "a family no switch combination reaches"


def test_one_family_per_hf_model_type_and_model_type():
    types = [f.hf_model_type for f in families.FAMILIES.values()]
    assert len(types) == len(set(types))
    for f in families.FAMILIES.values():
        assert families.by_hf_type(f.hf_model_type) is f
        assert f.hf_model_type in families.hf_types(f.model_type)
        assert set(f.switches) <= set(SWITCH_VALUES)
    assert families.hf_types("BERT") == ("bert",)


@pytest.mark.parametrize("name", [n for n, f in families.FAMILIES.items() if f.model_type == "GPT"])
def test_preset_flags_give_the_preset_and_pick_the_family(name):
    family = families.FAMILIES[name]
    extra = ["--num-experts", "4", "--moe-router-topk", "2"] if family.switches.get("experts") else []
    if family.switches.get("shared_experts"):
        extra += ["--moe-shared-expert-intermediate-size", "16"]
    model_cfg, _ = parse_args(MOCK + family.flags() + extra)
    for field, value in family.preset.items():
        assert getattr(model_cfg, field) == value, (name, field)
    args = {f: getattr(model_cfg, f) for f in ("multi_latent_attention", "qk_layernorm", "num_experts",
                                                 "moe_shared_expert_intermediate_size", "position_embedding_type")}
    assert families.for_model(args) is family


def test_a_model_no_family_holds_is_one_line():
    with pytest.raises(CheckpointError, match="no HuggingFace family") as e:  # Qwen3-MoE: not a family here
        families.for_model({"qk_layernorm": True, "num_experts": 4, "position_embedding_type": "rope"})
    assert "\n" not in str(e.value) and "qk_norm True" in str(e.value)
    assert families.for_model({}, "BERT") is families.FAMILIES["bert"]
