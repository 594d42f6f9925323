"""--yaml-cfg FILE (Megatron-LM's flag): the same options as the command line, in a YAML file.

Keys are the options' names with underscores (Megatron-LM's format: `num_layers: 4`, or a flag's own
name such as `disable_bias_linear: true`); a mapping whose key is no option is a group of options
(Megatron-LM's `language_model:` and `model_parallel:`, or any other name), nested as deep as wanted.
`${NAME}` in a text value is the environment variable NAME, as in Megatron-LM.

The file becomes flags at the place of `--yaml-cfg FILE` in argv: flags after it override it (the
pretrain scripts put it first among the user's flags, so every command-line flag does), flags before
it (the embedded recipe's own settings) are overridden. A switch set in the file cannot be unset on
the command line, as a switch given twice cannot. Each unknown key or value of the wrong type is one
line naming its path in the file.
"""
import argparse
import dataclasses
import os
import re

from ...core.config_fields import flag_of
from ...core.errors import ConfigError

FLAG = "--yaml-cfg"
_ENV = re.compile(r"\$\{([^}]*)\}")
_NUMBER = (int, float)


def _options(parser):
    """key -> (action, whether the key is the field's name rather than a flag's): every name a key may use."""
    keys = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        for opt in action.option_strings:
            if opt.startswith("--"):
                keys[opt[2:].replace("-", "_")] = (action, False)
        keys[action.dest] = (action, True)  # the field's name wins where it is also a flag's
    return keys


def _scalar_text(action, value):
    """The command-line text of one YAML scalar for `action`; ValueError(the reason) if it does not fit."""
    kind = action.type
    if isinstance(value, list) and kind not in (int, float, str, None):
        value = str(value)  # a flag's own parse function reads a list expression (--moe-layer-freq [1,0,1])
    if isinstance(value, bool) or not isinstance(value, (str, *_NUMBER)):
        raise ValueError(f"expected {getattr(kind, '__name__', 'a value')}, got {_shown(value)}")
    if kind is int and not isinstance(value, int):
        raise ValueError(f"expected an integer, got {_shown(value)}")
    if kind is float and isinstance(value, str):
        float(value)  # PyYAML reads 1e-5 (no dot) as text: accept it as the number it spells
    elif kind is float and not isinstance(value, _NUMBER):
        raise ValueError(f"expected a number, got {_shown(value)}")
    text = repr(float(value)) if kind is float else str(value)
    parsed = kind(text) if kind is not None else text  # a flag's own parse function (e.g. --split) checks it
    if action.choices is not None and parsed not in action.choices:
        raise ValueError(f"{_shown(value)} is not one of {', '.join(map(str, action.choices))}")
    return text


def _shown(value):
    return "null" if value is None else repr(value)


def _flags(action, by_field, value, path):
    """The argv tokens that set `action` to the YAML value (none for a default)."""
    flag = action.option_strings[-1]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_shown(value)}")
        # the field's name says the field's value; a flag's name says whether the flag is given
        return [flag] if value == (action.const if by_field else True) else []
    if value is None:
        if action.default is None:
            return []
        raise ValueError(f"null is no value of {flag}: leave the key out for its default ({action.default})")
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        # a text scalar splits at whitespace, as the shell splits the flag's values (Megatron-LM's data_path too)
        items = value if isinstance(value, list) else value.split() if isinstance(value, str) else [value]
        if isinstance(action.nargs, int) and len(items) != action.nargs:
            raise ValueError(f"expected a list of {action.nargs} values, got {_shown(value)}")
        if action.nargs == "+" and not items:
            raise ValueError("expected at least one value, got an empty list")
        return [flag, *(_scalar_text(action, v) for v in items)]
    return [f"{flag}={_scalar_text(action, value)}"]


def _expand_env(value, path, problems):
    if not isinstance(value, str):
        return value
    for name in _ENV.findall(value):
        if name not in os.environ:
            problems.append(f"{path}: environment variable {name} (in {value!r}) is not set")
            return value
        value = value.replace(f"${{{name}}}", os.environ[name])
    return value


def _walk(tree, prefix, keys, seen, out, problems):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        name = str(key).replace("-", "_")
        if name not in keys:
            if isinstance(value, dict):  # a group of options (Megatron-LM's language_model:, model_parallel:)
                _walk(value, path + ".", keys, seen, out, problems)
            else:
                problems.append(f"{path}: unknown option (no flag --{name.replace('_', '-')}; see --help)")
            continue
        action, by_field = keys[name]
        if action.dest == "yaml_cfg":
            problems.append(f"{path}: a YAML file cannot name another one; give {FLAG} once, on the command line")
            continue
        if action.dest in seen:
            problems.append(f"{path}: {action.option_strings[-1]} is already set at {seen[action.dest]}; keep one")
            continue
        seen[action.dest] = path
        value = [_expand_env(v, path, problems) for v in value] if isinstance(value, list) else \
            _expand_env(value, path, problems)
        try:
            out.extend(_flags(action, by_field, value, path))
        except (ValueError, TypeError, argparse.ArgumentTypeError, ConfigError) as e:
            problems.append(f"{path}: {e}")


def _load(path):
    try:
        import yaml
    except ImportError as e:
        raise ConfigError(f"{FLAG} needs PyYAML, which is not installed: pip install pyyaml") from e
    try:
        with open(path) as f:
            tree = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"{FLAG} {path}: cannot read it ({e.strerror}); give an existing YAML file") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{FLAG} {path}: not valid YAML{where} ({getattr(e, 'problem', e)}); fix the file") from e
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{FLAG} {path}: expected a mapping of options (key: value), got {type(tree).__name__}")
    return tree


def yaml_flags(parser, path) -> list[str]:
    """The argv tokens that the YAML file at `path` stands for. Raises ConfigError, one line per problem."""
    tree = _load(path)
    out, problems = [], []
    _walk(tree, "", _options(parser), {}, out, problems)
    if problems:  # user_error prints "error: " before the first line; every line reads the same
        raise ConfigError("\nerror: ".join(f"{FLAG} {path}: {p}" for p in problems))
    return out


def _position(argv):
    """(index, path) of the last --yaml-cfg in argv (argparse's rule: the last one given counts), or None."""
    found = None
    for i, tok in enumerate(argv):
        if tok == FLAG and i + 1 < len(argv):
            found = (i, 2, argv[i + 1])
        elif tok.startswith(FLAG + "="):
            found = (i, 1, tok[len(FLAG) + 1:])
    return found


def expand_yaml_cfg(parser, argv):
    """argv with the file of its --yaml-cfg as flags at its place (the flag itself kept after them, so
    the configuration records the file)."""
    argv = list(argv)
    found = _position(argv)
    if found is None:
        return argv
    i, width, path = found
    return argv[:i] + yaml_flags(parser, path) + argv[i:i + width] + argv[i + width:]


def yaml_cfg_first(argv):
    """The user's argv with --yaml-cfg FILE moved to the front, so that every flag given beside it overrides it."""
    argv = list(argv)
    found = _position(argv)
    if found is None:
        return argv
    i, width, _ = found
    return argv[i:i + width] + argv[:i] + argv[i + width:]


def config_differences(*configs):
    """`--flag value` for every field of the configs that differs from its default: what the run sets."""
    for cfg in configs:
        for f in dataclasses.fields(cfg):
            if f.metadata.get("cli") is False or f.default is dataclasses.MISSING:
                continue
            value = getattr(cfg, f.name)
            if value == f.default:
                continue
            flag = flag_of(type(cfg), f.name)
            if isinstance(value, bool):
                yield flag
            else:
                yield f"{flag} {' '.join(map(str, value)) if isinstance(value, list) else value}"


def log_configuration(model_cfg, train_cfg, log):
    """With --yaml-cfg: the merged configuration (file and command line), as the flags that differ from defaults."""
    if train_cfg.yaml_cfg is None:
        return
    log(f"> configuration from {FLAG} {train_cfg.yaml_cfg} and the command line (differences from defaults):")
    for line in config_differences(model_cfg, train_cfg):
        log(f"    {line}")
