"""Legal-type but absurd numbers (issue 41, item 7): every numeric flag, with the feature it modifies on, is
walked with a negative value (and NaN and inf for the real-valued ones) and must fail in validation with one
line naming it; every count whose default is None ("not given") is walked with 0, which must not be read as
"not given" unless listed below with the reason. A new numeric flag is walked as soon as it exists."""
import dataclasses
import types
import typing

import pytest

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.config_fields import flag_of
from megatron.core.fp8.config import largest_margin
from megatron.core.transformer.mla_config import MLAConfig
from megatron.training.config import modifier_flags
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.config.training_config import TrainingConfig

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "4", "--lr", "1e-3"]
# the arguments that switch each feature on (every feature a `requires=` names must be here)
FEATURE_ON = {
    "num_experts": ["--num-experts", "4"],
    "fp8_format": ["--fp8-format", "e4m3"],
    "first_last_layers_bf16": ["--fp8-format", "e4m3", "--first-last-layers-bf16"],
    "mtp_num_layers": ["--mtp-num-layers", "1", "--position-embedding-type", "rope"],
    "moe_router_group_topk": ["--num-experts", "4", "--moe-router-num-groups", "2", "--moe-router-group-topk", "1"],
    "profile": ["--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb"],
    "use_pytorch_profiler": ["--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb"],
    "tensorboard_dir": ["--tensorboard-dir", "tb"],
    "wandb_project": [],  # its fields are text: not walked
    "timing_log_level": ["--timing-log-level", "1"],
    "optimizer": {"muon": ["--optimizer", "muon"], "sgd": ["--optimizer", "sgd"], "adam": []},
    "lr_decay_style": {"WSD": ["--lr-decay-style", "WSD"]},
    "fp16": ["--fp16"],
    "tokenizer_type": {"TikTokenizer": []},  # needs its files: its numbers are checked whatever the tokenizer
    "manual_gc": ["--manual-gc"],
    "lr_warmup_iters": ["--lr-warmup-iters", "1"],
    "save": [], "load": [],  # their fields are switches: not walked
    "multi_latent_attention": ["--multi-latent-attention", "--position-embedding-type", "rope"],
}
OTHER_FEATURES = {"num_query_groups": ["--group-query-attention"]}  # read only with that switch
# None-default counts where 0 has a meaning of its own
ZERO_MEANS = {
    "moe_z_loss_coeff": "a weight: 0 applies no z-loss, as None",
    "decoupled_lr": "a learning rate: 0 freezes the embedding and output layer",
    "logging_level": "Python's NOTSET",
    "profile_ranks": "rank 0",
    "lr": "a learning rate of 0 is a run that changes nothing (Megatron-LM allows it)",
    "lr_warmup_fraction": "no warm-up",
}


def _base(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp


def _numeric():
    for cls in (TransformerConfig, TrainingConfig):
        for f in dataclasses.fields(cls):
            if f.metadata.get("cli") is not False and not f.metadata.get("choices") and _base(f.type) in (int, float):
                yield cls, f


def _feature_args(f):
    """The arguments that switch on the feature f modifies (the first of its alternatives)."""
    if f.name in {g.name for g in dataclasses.fields(MLAConfig)}:
        return FEATURE_ON["multi_latent_attention"]
    if f.name in OTHER_FEATURES:
        return OTHER_FEATURES[f.name]
    requires = f.metadata.get("requires")
    if requires is None:
        return []
    name, values = modifier_flags.terms(requires)[0]
    on = FEATURE_ON[name]
    return on[values[0]] if isinstance(on, dict) else on


def _error(args):
    try:
        model_cfg, train_cfg = parse_args(MOCK + args)
        resolve(model_cfg, train_cfg, 1, lambda c: types.SimpleNamespace(vocab_size=c.null_vocab_size + 1))
        validate(model_cfg, train_cfg, 1)
    except ConfigError as e:
        return str(e)
    return None


CASES = [(cls, f, v) for cls, f in _numeric() for v in (["-1"] if _base(f.type) is int else ["-1", "nan", "inf"])]


def test_every_feature_a_modifier_names_can_be_switched_on():
    named = {modifier_flags.terms(requires)[0][0]  # the alternative _feature_args switches on
             for requires in modifier_flags.declared(TransformerConfig, TrainingConfig).values()}
    assert named <= set(FEATURE_ON), named - set(FEATURE_ON)


@pytest.mark.parametrize("cls,f,value", CASES, ids=[f"{f.name}={v}" for _, f, v in CASES])
def test_negative_nan_and_inf_are_refused_naming_the_flag(cls, f, value):
    flag = flag_of(cls, f.name)
    error = _error(_feature_args(f) + [flag, value])
    assert error is not None and flag in error and "\n" not in error, f"{flag} {value}: {error}"


ZERO_CASES = [(cls, f) for cls, f in _numeric() if f.default is None]


@pytest.mark.parametrize("cls,f", ZERO_CASES, ids=[f.name for _, f in ZERO_CASES])
def test_zero_is_not_read_as_not_given(cls, f):
    flag = flag_of(cls, f.name)
    error = _error(_feature_args(f) + [flag, "0"])
    if f.name in ZERO_MEANS:
        assert error is None or flag not in error, f"{flag} 0 is listed as meaningful but refused: {error}"
    else:
        assert error is not None and flag in error, f"{flag} 0 passes: it would read as not given"


@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
def test_an_fp8_margin_that_underflows_every_scale_is_refused(fmt):
    top = largest_margin(fmt)
    assert top == 14  # e4m3's 448 / 2^14 is still at least its smallest normal 2^-6; 2^15 is not
    assert _error(["--fp8-format", fmt, "--fp8-margin", str(top)]) is None
    error = _error(["--fp8-format", fmt, "--fp8-margin", str(top + 1)])
    assert error.startswith(f"--fp8-margin must be in [0, 14] with --fp8-format {fmt}, got 15")
