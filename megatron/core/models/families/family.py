"""What a model family is: the record each family module fills (families/<name>.py) and the registry holds
(families/__init__.py).

A family is a set of our config values (its preset: the flags a user gives for it, e.g. rope, RMSNorm,
SwiGLU) plus a HuggingFace counterpart. Which family one of our models belongs to is decided by its layer
switches, the few config values that pick a different layer (the attention kind, per-head q/k norms, experts,
shared experts, encoder or decoder, how positions enter): each family names the switch values it holds, no two
families hold the same ones (tests/unit/test_model_families.py), and the rest of what a family needs (its
norm, activation, biases, sizes) is checked by its own adapter, which refuses what it cannot hold in one line.
"""
import dataclasses
from collections.abc import Callable, Mapping

from ...config import TransformerConfig
from ...config_fields import flag_of


def layer_switches(args, model_type="GPT"):
    """The switch values of our model args `args` (a checkpoint's saved model config, as a dict)."""
    return {
        "encoder": model_type == "BERT",
        "attention": "latent" if args.get("multi_latent_attention") else "standard",
        "qk_norm": bool(args.get("qk_layernorm")),
        "experts": bool(args.get("num_experts")),
        "shared_experts": bool(args.get("num_experts") and args.get("moe_shared_expert_intermediate_size")),
        "positions": "rope" if args.get("position_embedding_type") == "rope" else "learned_absolute",
    }


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family. `to_ours(hf_config, state_dict) -> (model args, {init_key: tensor})` reads a
    transformers model; `to_hf(model args, tensors, buffers) -> (hf config kwargs, state dict)` writes one
    (buffers: our non-trained state by init key, e.g. MoE expert biases; only a family with holds_expert_bias
    reads them). Both are pure tensor re-arrangement; tools/checkpoint/convert.py reads and writes the files."""

    name: str                      # ours, the registry's key
    title: str                     # as a user reads it
    model_type: str                # "GPT" or "BERT": the trainer script and convert.py's --model-type
    switches: Mapping              # layer_switches values a model of this family has (a subset of the keys)
    preset: Mapping                # our config values that make the family, beyond its sizes (flags())
    hf_model_type: str             # config.json's model_type
    hf_config_class: str           # transformers' class names
    hf_model_class: str | Callable  # or (HF state dict) -> the name (BERT with or without its binary head)
    hf_required_keys: tuple        # config.json keys without which transformers would use its defaults
    to_ours: Callable
    to_hf: Callable
    hf_tied: tuple = ("lm_head.weight",)  # HF names the model ties to another (not in a tied state dict)
    holds_expert_bias: bool = False  # the HF model has a place for our MoE routers' expert bias
    # (HF state dict, HF config kwargs) -> names the family's files hold that transformers' model has no place
    # for (DeepSeek-V3's multi-token prediction layers): written beside the model, not loaded into it
    hf_files_only: Callable | None = None

    def holds_switches(self, switches) -> bool:
        return all(switches[k] == v for k, v in self.switches.items())

    def model_class(self, sd) -> str:
        return self.hf_model_class(sd) if callable(self.hf_model_class) else self.hf_model_class

    def flags(self):
        """The preset as command-line flags (--swiglu, --disable-bias-linear, --normalization RMSNorm, ...)."""
        fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
        out = []
        for name, value in self.preset.items():
            flag = flag_of(TransformerConfig, name)
            if isinstance(value, bool):  # a switch: its flag turns the default over
                out += [flag] if value != fields[name].default else []
            elif value != fields[name].default:
                out += [flag, str(value)]
        return out
