"""Modifier flags given without the feature they modify (issue 41, item 7): every field that declares
`requires=` is named on the start-up line of flags without effect when its feature is off, and every field of
a feature's flag family declares it, so a new flag cannot pass silently."""
import copy
import dataclasses
import types
import typing

import pytest

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.config_fields import flag_of
from megatron.core.fp8.config import Fp8Config
from megatron.core.transformer.moe.moe_config import MoEConfig
from megatron.core.transformer.mtp_config import MTPConfig
from megatron.training.config import modifier_flags
from megatron.training.config import no_effect_flags as no_effect
from megatron.training.config.arguments import parse_args
from megatron.training.config.logging_flags import LoggingOptions
from megatron.training.config.optimizer_flags import OptimizerOptions
from megatron.training.config.resolve import resolve, validate
from megatron.training.config.training_config import TrainingConfig

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "4", "--lr", "1e-3"]
# features on in the default configs (AdamW), switched off to walk their modifiers
FEATURE_OFF = {"optimizer": "sgd"}
# the switch of each feature whose every other field modifies it
FAMILIES = {MoEConfig: "num_experts", Fp8Config: "fp8_format", MTPConfig: "mtp_num_layers"}
# fields of those families that are not modifiers, and why
NOT_MODIFIERS = {
    "expert_model_parallel_size": "an error without --num-experts (check_moe), as in Megatron-LM",
    "moe_permute_fusion": "without effect in every model (no_effect_flags.py)",
    "moe_per_layer_logging": "without effect in every model (no_effect_flags.py)",
}
# flag families of the logging and optimizer options, by name: (field name test, the feature)
PREFIXES = [(LoggingOptions, lambda n: n.startswith("wandb_") and n != "wandb_project"),
            (LoggingOptions, lambda n: n.startswith(("profile_", "pytorch_profiler_", "use_pytorch_profiler"))),
            (LoggingOptions, lambda n: "tensorboard" in n),
            (LoggingOptions, lambda n: n in ("timing_log_option", "barrier_with_l1_time")),
            (OptimizerOptions, lambda n: n.startswith(("muon_", "sgd_"))),
            (TrainingConfig, lambda n: n.startswith(("adam_", "lr_wsd_", "tiktoken_", "manual_gc_"))
             or "loss_scale" in n or n in ("hysteresis", "special_tokens", "no_load_optim", "no_load_rng", "async_save",
                                           "lr_warmup_init", "ckpt_fully_parallel_save", "ckpt_fully_parallel_load"))]


def _cfgs(args):
    model_cfg, train_cfg = parse_args(MOCK + args)
    resolve(model_cfg, train_cfg, 1, lambda c: types.SimpleNamespace(vocab_size=c.null_vocab_size + 1))
    validate(model_cfg, train_cfg, 1)
    return model_cfg, train_cfg


def _other_value(f):
    """A value of the field's type other than its default (what a user giving the flag would set)."""
    if f.metadata.get("choices"):
        return next(c for c in f.metadata["choices"] if c != f.default)
    tp = f.type
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is bool:
        return not f.default
    if typing.get_origin(tp) is list:
        return [0]
    if tp in (int, float):
        return (f.default or 0) + (1 if tp is int else 0.5)
    return "x"


def _declared():
    return sorted(modifier_flags.declared(TransformerConfig, TrainingConfig).items())


@pytest.mark.parametrize("name,requires", _declared(), ids=[n for n, _ in _declared()])
def test_every_modifier_without_its_feature_is_named_with_the_feature(name, requires):
    cfgs = _cfgs([])
    fields = {f.name: (cfg, f) for cfg in cfgs for f in dataclasses.fields(cfg)}
    for term, _ in modifier_flags.terms(requires):
        assert term in fields, f"{name}: requires names no field {term}"
    changed = [copy.copy(c) for c in cfgs]
    if modifier_flags.missing(fields, requires) is None:  # a feature on by default (AdamW): switched off
        for term, value in FEATURE_OFF.items():
            setattr(next(c for c in changed if hasattr(c, term)), term, value)
    fields = {f.name: (c, f) for c in changed for f in dataclasses.fields(c)}
    assert modifier_flags.missing(fields, requires) is not None, f"{name}: the default configs have its feature on"
    cfg, f = fields[name]
    setattr(cfg, name, _other_value(f))
    found = dict(no_effect.accepted(*changed))
    flag = flag_of(type(cfg), name)
    assert flag in found, f"{flag} given without its feature is not named"
    feature = flag_of(type(fields[modifier_flags.terms(requires)[0][0]][0]), modifier_flags.terms(requires)[0][0])
    assert feature in found[flag] or name in ("fp8_param_gather", "fp8_output_layer", "mtp_loss_scaling_factor")


def test_every_flag_of_a_feature_family_declares_what_it_modifies():
    """A new MoE, FP8, MTP, W&B, profiler, TensorBoard, timer or optimizer flag must say which feature it
    modifies (or why it is not a modifier): otherwise it would pass silently without it."""
    undeclared = [f.name for cls, switch in FAMILIES.items() for f in dataclasses.fields(cls)
                  if f.name != switch and f.name not in NOT_MODIFIERS and f.metadata.get("requires") is None]
    undeclared += [f.name for cls, member in PREFIXES for f in dataclasses.fields(cls)
                   if member(f.name) and f.metadata.get("requires") is None]
    assert not undeclared, undeclared


def test_nothing_is_named_with_its_feature_on():
    m, t = _cfgs(["--num-experts", "4", "--moe-router-topk", "1", "--moe-router-force-load-balancing",
                  "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                  "--num-layers-at-start-in-bf16", "2", "--num-layers-at-end-in-bf16", "0", "--optimizer", "sgd",
                  "--sgd-momentum", "0.5", "--timing-log-level", "1", "--timing-log-option", "all"])
    assert modifier_flags.without_feature(m, t) == []
    assert no_effect.line(m, t) is None


def test_a_chain_names_the_first_feature_missing():
    m, t = _cfgs(["--fp8-format", "e4m3", "--num-layers-at-end-in-bf16", "2"])
    assert dict(no_effect.accepted(m, t)) == {
        "--num-layers-at-end-in-bf16": "it goes with --first-last-layers-bf16, not given"}
    m, t = _cfgs(["--first-last-layers-bf16", "--num-layers-at-end-in-bf16", "2"])
    assert dict(no_effect.accepted(m, t))["--first-last-layers-bf16"] == "it goes with --fp8-format, not given"


@pytest.mark.parametrize("args,flag,why", [
    (["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe"], "--recompute-modules",
     "moe: a dense model (no --num-experts) has no MoE layer"),
    (["--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb", "--profile-step-start", "5",
      "--profile-step-end", "7"], "--profile",
     "its window starts at iteration 5, after the last one (--train-iters 4)"),
    (["--fp8-format", "e4m3", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "1",
      "--num-layers-at-end-in-bf16", "3"], "--fp8-format", "keep all 4 layers out of FP8"),
])
def test_values_that_leave_their_feature_nothing_to_do(args, flag, why):
    found = dict(no_effect.accepted(*_cfgs(args)))
    assert why in found[flag]


def test_profile_window_inside_the_run_and_fp8_layers_left_are_not_named():
    assert no_effect.line(*_cfgs(["--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb",
                                  "--profile-step-start", "4", "--profile-step-end", "5"])) is None
    assert no_effect.line(*_cfgs(["--fp8-format", "e4m3", "--first-last-layers-bf16"])) is None


def test_bf16_layer_counts_beyond_a_pipeline_stage_are_refused_as_megatron():
    with pytest.raises(ConfigError, match=r"--num-layers-at-start-in-bf16 \(3\) must be between 0 and the layers "
                                          r"per pipeline stage \(2\)"):
        _cfgs(["--fp8-format", "e4m3", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "3",
               "--pipeline-model-parallel-size", "2"])
