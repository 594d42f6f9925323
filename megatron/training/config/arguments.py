"""The command line, generated from the config dataclasses' fields and help texts.

Flag names follow Megatron-LM: a field `num_layers` is `--num-layers`, unless its
metadata names another flag (e.g. `add_bias_linear` is switched off by
`--disable-bias-linear`).
"""
import argparse
import dataclasses
import re
import sys
import types
import typing

from ...core.config import ConfigError, TransformerConfig
from . import unbuilt_flags as not_built
from .training_config import TrainingConfig
from .yaml_config import expand_yaml_cfg


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # a value that starts like a negative number (--split -1,2,0, --lr -1e-3) is a value, so its
        # range check can name it, not "expected one argument": no flag starts with a digit
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message):
        # one clear line instead of usage + message; the caller exits non-zero
        raise ConfigError(f"{message} (see --help)")


def _base_type(tp):
    # `X | None` (types.UnionType) and Optional[X] (typing.Union) alike
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is list:
        tp = typing.get_args(tp)[0]
    return tp


def _add_fields(group, cls):
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if meta.get("cli") is False:
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        tp = _base_type(f.type)
        if tp is bool:
            action = "store_false" if f.default is True else "store_true"
            group.add_argument(flag, dest=f.name, action=action, help=meta["help"])
        else:
            group.add_argument(flag, dest=f.name, type=meta.get("parse") or tp, default=f.default,
                               choices=meta.get("choices"), nargs=meta.get("nargs"),
                               help=meta["help"] + (f" (default {f.default})" if f.default is not None else ""))


def build_parser(description="Pretrain a GPT model.", extra=()) -> argparse.ArgumentParser:
    """extra: (group title, dataclass) pairs of model-specific options (e.g. BERT's)."""
    parser = _Parser(description=description, allow_abbrev=False)
    _add_fields(parser.add_argument_group("model and parallelism"), TransformerConfig)
    _add_fields(parser.add_argument_group("training, data and logging"), TrainingConfig)
    for title, cls in extra:
        _add_fields(parser.add_argument_group(title), cls)
    not_built.add_flags(parser)
    return parser


def _take(cls, ns):
    names = {f.name for f in dataclasses.fields(cls) if f.metadata.get("cli") is not False}
    return cls(**{n: getattr(ns, n) for n in names})


def parse_args(argv=None, description="Pretrain a GPT model.", extra=()):
    """argv -> (TransformerConfig, TrainingConfig, one instance per extra dataclass), not yet
    validated. extra: (group title, dataclass) pairs. Raises ConfigError (not_built.NotBuiltError for
    Megatron-LM flags whose feature is not built here)."""
    parser = build_parser(description, extra)
    ns = parser.parse_args(expand_yaml_cfg(parser, sys.argv[1:] if argv is None else argv))
    configs = (_take(TransformerConfig, ns), _take(TrainingConfig, ns), *(_take(cls, ns) for _, cls in extra))
    not_built.check(ns, configs[0])  # one line naming every feature given that is not built here
    return configs
