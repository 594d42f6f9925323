"""Megatron-LM flags (and flag values) whose feature is not built here. Each parses, so a recipe that
gives one stops before anything starts with one line that names every such feature and its flags:

    error: not built here: MXFP8 scaling (Blackwell's MX formats) (--fp8-recipe mxfp8; issue 28); the flex
    token dispatcher (DeepEP / HybridEP) (--moe-token-dispatcher-type flex; not planned); drop those flags

A flag only here has no config field; build_parser adds it unless a config dataclass defines the same
flag, so a feature that lands with its real fields takes its flags over without a change here (delete
its rows then). Value rules read the parsed configs (e.g. --moe-token-dispatcher-type flex).
"""
from typing import NamedTuple

from ...core.errors import ConfigError
from ...core.transformer.model_options import RECOMPUTE_NOT_BUILT

FEATURES = {  # key -> (what a user reads, who builds it)
    "fp8_te": ("FP8 through Transformer Engine (fp8_autocast; our FP8 runs with --transformer-impl local)",
               "issue 28"),
    "mxfp8": ("MXFP8 scaling (Blackwell's MX formats)", "issue 28"),
    "yarn": ("YaRN RoPE without --multi-latent-attention", "not built"),
    "flex": ("the flex token dispatcher (DeepEP / HybridEP)", "not planned"),
    "recompute": ("selective recompute of these modules", "not planned"),
    "sinks": ("learnable attention sinks (gpt-oss; off-by-one is built)", "not built: gpt-oss"),
    "gptoss_mlp": ("gpt-oss's clamped quick-GeGLU with a linear offset", "not built: gpt-oss"),
    "gptoss_rope": ("gpt-oss's YaRN RoPE settings (--enable-gpt-oss)", "not built: gpt-oss"),
    "syrk": ("the Triton SYRK kernel for Muon's Gram matrices", "not built"),
    "inprocess": ("in-process restart (NVRx)", "not built: restart with torchrun --max-restarts, "
                  "docs/fault_tolerance.md"),
}


class Flag(NamedTuple):
    feature: str
    kwargs: dict  # argparse add_argument keywords (action, type, nargs, choices, default)


_SWITCH = {"action": "store_true"}
_INT, _FLOAT, _TEXT = {"type": int}, {"type": float}, {"type": str}

FLAGS = {
    "--moe-flex-dispatcher-backend": Flag("flex", _TEXT),
    # the default value of these is what runs here: refused only when another is given
    "--glu-linear-offset": Flag("gptoss_mlp", {"type": float, "default": 0.0}),
    "--quick-geglu": Flag("gptoss_mlp", _SWITCH), "--activation-func-clamp-value": Flag("gptoss_mlp", _FLOAT),
    "--enable-gpt-oss": Flag("gptoss_rope", _SWITCH),
    "--muon-use-syrk": Flag("syrk", _SWITCH),
    "--inprocess-restart": Flag("inprocess", _SWITCH),
    # its companions, refused only when given another value than Megatron-LM's default
    **{f"--inprocess-{name}": Flag("inprocess", {"type": kind, "default": default}) for name, kind, default in (
        ("max-iterations", int, None), ("monitor-thread-interval", float, 1.0),
        ("monitor-process-interval", float, 1.0), ("progress-watchdog-interval", float, 1.0),
        ("heartbeat-interval", float, 30.0), ("soft-timeout", float, 60.0), ("hard-timeout", float, 90.0),
        ("heartbeat-timeout", float, 60.0), ("barrier-timeout", float, 120.0), ("completion-timeout", float, 120.0),
        ("last-call-wait", float, 1.0), ("termination-grace-time", float, 1.0),
        ("granularity", str, "node"), ("active-world-size", int, None))},
    "--inprocess-empty-cuda-cache": Flag("inprocess", _SWITCH),
}


def _dest(flag):
    return "not_built_" + flag.lstrip("-").replace("-", "_")


def add_flags(parser):
    """Add every FLAGS entry the parser does not define yet (a built feature's own field wins)."""
    known = {o for a in parser._actions for o in a.option_strings}
    group = parser.add_argument_group("Megatron-LM flags of features not built here (refused in one line)")
    for flag, (feature, kwargs) in FLAGS.items():
        if flag not in known:
            label = FEATURES[feature][0]
            group.add_argument(flag, dest=_dest(flag), help=f"Not built here: {label}.",
                               **{"default": None, **kwargs})


def _value_rules(model_cfg):
    """(feature, flag text) of config values whose feature is not built."""
    c = model_cfg
    if c.fp8_format is not None:
        if c.transformer_impl == "transformer_engine":
            yield "fp8_te", "--fp8-format with --transformer-impl transformer_engine"
        if c.fp8_recipe == "mxfp8":
            yield "mxfp8", "--fp8-recipe mxfp8"
    if c.moe_token_dispatcher_type == "flex":
        yield "flex", "--moe-token-dispatcher-type flex"
    if c.rope_type == "yarn" and not c.multi_latent_attention:
        yield "yarn", "--rope-type yarn"
    if c.softmax_type == "learnable":
        yield "sinks", "--softmax-type learnable"
    for module in c.recompute_modules or ():
        if module in RECOMPUTE_NOT_BUILT:
            yield "recompute", f"--recompute-modules {module}"


class NotBuiltError(ConfigError):
    """Flags of features not built here; .features: [(feature key, [flags])] in FEATURES order."""

    def __init__(self, found):
        self.features = [(k, found[k]) for k in FEATURES if k in found]
        parts = [f"{FEATURES[k][0]} ({', '.join(flags)}; {FEATURES[k][1]})" for k, flags in self.features]
        super().__init__("not built here: " + "; ".join(parts) + "; drop those flags")


def check(namespace, model_cfg):
    """NotBuiltError naming every feature whose flag (or value) is given; nothing when none is."""
    found = {}
    for flag, (feature, kwargs) in FLAGS.items():
        value = getattr(namespace, _dest(flag), None)
        if value is not None and value != kwargs.get("default") and value is not False:
            found.setdefault(feature, []).append(flag)
    for feature, text in _value_rules(model_cfg):
        found.setdefault(feature, []).append(text)
    if found:
        raise NotBuiltError(found)
