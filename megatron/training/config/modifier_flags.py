"""Modifier flags given without the feature they modify: generated from the config fields' `requires=`
metadata (core/config_fields.opt), so a new flag that declares what it modifies is covered without an
edit here. Each is named, with the feature it waits for, in the start-up line of flags without effect
(no_effect_flags.py), e.g.

    > accepted, no effect here: --moe-router-topk (it goes with --num-experts, not given), ...

A requirement is a field name (the feature is on when that field is set: not None, False or 0), a pair
(field name, value or tuple of values) or a list of those (any of them on). The feature's own
requirement counts too: --num-layers-at-start-in-bf16 needs --first-last-layers-bf16, which needs
--fp8-format.
"""
import dataclasses

from ...core.config_fields import flag_of


def _fields(cfgs):
    """{field name: (config, dataclass field)} over the configs, the first config owning a name winning."""
    found = {}
    for cfg in cfgs:
        for f in dataclasses.fields(cfg):
            found.setdefault(f.name, (cfg, f))
    return found


def _plain(value):
    # a one-item list is its item after resolve (Megatron-LM's nargs="+" flags): compare both forms alike
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return value[0]
    return value


def given(cfg, f) -> bool:
    """Whether the field's value differs from its default (a flag given with a value other than its default)."""
    return _plain(getattr(cfg, f.name)) != _plain(f.default)


def terms(requires):
    """The requirement as [(field name, accepted values or None for 'set')]."""
    items = requires if isinstance(requires, list) else [requires]
    out = []
    for item in items:
        if isinstance(item, tuple):
            name, values = item
            out.append((name, values if isinstance(values, tuple) else (values,)))
        else:
            out.append((item, None))
    return out


def _holds(fields, name, values) -> bool:
    cfg, _ = fields[name]
    value = getattr(cfg, name)
    return value not in (None, False, 0) if values is None else value in values


def _describe(fields, requires) -> str:
    parts = []
    for name, values in terms(requires):
        flag = flag_of(type(fields[name][0]), name)
        parts.append(flag if values is None else f"{flag} {' or '.join(map(str, values))}")
    return " or ".join(parts)


def missing(fields, requires, seen=()):
    """The requirement text of the first feature in the chain that is off, or None when all are on."""
    on = [name for name, values in terms(requires) if _holds(fields, name, values)]
    if not on:
        return _describe(fields, requires)
    for name in on:  # the feature itself may modify another
        _, f = fields[name]
        inner = f.metadata.get("requires")
        if inner is not None and name not in seen:
            found = missing(fields, inner, (*seen, name))
            if found is None:
                return None
        else:
            return None
    return found


def without_feature(*cfgs):
    """[(config, field name, why)] of the fields given although the feature they modify is off."""
    fields = _fields(cfgs)
    out = []
    for name, (cfg, f) in fields.items():
        requires = f.metadata.get("requires")
        if requires is None or not given(cfg, f):
            continue
        off = missing(fields, requires)
        if off is not None:
            out.append((cfg, name, f"it goes with {off}, not given"))
    return out


def declared(*classes):
    """{field name: requires} of every field of the classes that declares what it modifies."""
    return {f.name: f.metadata["requires"] for cls in classes for f in dataclasses.fields(cls)
            if f.metadata.get("requires") is not None}
