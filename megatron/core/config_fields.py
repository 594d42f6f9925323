"""CLI metadata of configuration fields: opt() declares a field with its help text and flag,
flag_of() names a field's flag in error messages. Kept apart from the dataclasses (config.py) so
the checks (config_checks.py) can name flags without importing the classes they check."""
import dataclasses


def opt(default, help, flag=None, choices=None, nargs=None, parse=None, requires=None):
    """A dataclass field with CLI metadata. flag: the Megatron-LM flag if not --field-name;
    parse: the function that turns the command-line text into the value (default: the field's type);
    requires: the feature this flag modifies, a field name (the feature is on when that field is set: not
    None, False or 0) or (field name, value or tuple of values); given without it the flag is named in
    the start-up line of flags without effect (training/config/modifier_flags.py).

    A bool field whose flag is given and whose default is True is switched off by that flag
    (e.g. --disable-bias-linear).
    """
    meta = {"help": help, "flag": flag, "choices": choices, "nargs": nargs, "parse": parse, "requires": requires}
    return dataclasses.field(default=default, metadata=meta)


def flag_of(cls, name):
    """The CLI flag for a config field, for error messages."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("flag") or "--" + name.replace("_", "-")
    raise KeyError(name)


def flag_namer(cfg):
    """name -> the CLI flag of that field of cfg's class (the one-argument form check_ranges takes)."""
    cls = type(cfg)

    def flag(name):
        return flag_of(cls, name)
    return flag
