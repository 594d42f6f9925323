"""Megatron-LM's own example recipes (tests/unit/megatron_recipes.py: their flags as data) through our
parser, resolve() and validate() at their world sizes (issue 31): every flag is known; none is silently
ignored (each changes the configuration, gives its default, or is on the start-up line of flags without
effect); the combination is valid, or refused in one line only for features another issue builds.

    python -m tests.unit.test_megatron_recipes     # prints the recipe table (accepted / no effect / refused)
"""
import dataclasses
import os
import re
import types

import pytest
import torch

from megatron.core.fusions import attention as attention_front
from megatron.training.config import no_effect_flags as no_effect
from megatron.training.config.arguments import build_parser, parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.config.unbuilt_flags import FEATURES, NotBuiltError
from megatron.training.tokenizer import build_tokenizer
from tests.unit.megatron_recipes import RECIPES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# why a refused feature may block a recipe: another issue builds it, or issue 31 asks for a one-line refusal
ALLOWED = {"fp8_te": "issue 28", "mxfp8": "issue 28",
           "yarn": "issue 30: built with MLA only",
           "flex": "issue 31: refuse in one line",
           "sinks": "issue 31: gpt-oss, refuse each",
           "gptoss_mlp": "issue 31: gpt-oss, refuse each", "gptoss_rope": "issue 31: gpt-oss, refuse each"}
EXPECTED_REFUSED = {
    "gpt3-175b": set(),
    "llama3-8b-fp8 (mock data)": set(), "llama3-8b-fp8 (real data)": set(),
    "mixtral-8x7b": set(),
    "megatron-fsdp llama3-8b-fp8 (mock data)": set(), "megatron-fsdp llama3-8b-fp8 (real data)": set(),
    "deepseek-v3 (megatron-fsdp)": {"flex"},
    "gpt-oss (mock data)": {"fp8_te", "sinks", "gptoss_mlp", "gptoss_rope"},
}


def _known():
    return {o for a in build_parser()._actions for o in a.option_strings}


def without(argv, flags):
    """argv with each of `flags` and the values after it (up to the next --flag) taken out."""
    out, skipping = [], False
    for a in argv:
        if a.startswith("--"):
            skipping = a in flags
        if not skipping:
            out.append(a)
    return out


def occurrences(argv):
    """[(flag, [values])] in order."""
    out = []
    for a in argv:
        if a.startswith("--"):
            out.append((a, []))
        else:
            out[-1][1].append(a)
    return out


def _tokenizer(recipe):
    def make(train_cfg):
        if train_cfg.tokenizer_type == "NullTokenizer":
            return build_tokenizer(train_cfg)
        return types.SimpleNamespace(vocab_size=recipe.vocab_size)
    return make


def _flag_text_to_flag(text):
    return text.split()[0]


def refused(argv):
    """(features {key: [flags]}, argv without them) of a recipe's argv."""
    try:
        parse_args(argv)
        return {}, argv
    except NotBuiltError as e:
        found = dict(e.features)
        assert "\n" not in str(e) and str(e).startswith("not built here: ")
        flags = {_flag_text_to_flag(t) for texts in found.values() for t in texts}
        return found, without(argv, flags)


def resolved(argv, recipe, monkeypatch):
    """The configs of argv, resolved and validated at the recipe's world size. Transformer Engine is taken to
    be installed (recipes ask for it with --transformer-impl transformer_engine; this machine has none), and the
    machine to have a GPU (--profile alone marks the steps for nsys, which is refused where no GPU is)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = attention_front.available
    monkeypatch.setattr(attention_front, "available",
                        lambda b, d, t: (True, None) if b in ("te", "fused") else real(b, d, t))
    model_cfg, train_cfg = parse_args(argv)
    resolve(model_cfg, train_cfg, recipe.world_size, _tokenizer(recipe))
    validate(model_cfg, train_cfg, recipe.world_size)
    return model_cfg, train_cfg


def _dest_of(flag):
    return next(a.dest for a in build_parser()._actions if flag in a.option_strings)


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_recipe_flags_are_known_valid_or_refused_for_a_named_feature(recipe, monkeypatch):
    known = _known()
    argv = recipe.argv
    unknown = [f for f, _ in occurrences(argv) if f not in known]
    assert not unknown, f"{recipe.name}: unknown flags {unknown}"
    found, rest = refused(argv)
    assert set(found) <= set(ALLOWED), f"{recipe.name}: refused for {set(found) - set(ALLOWED)}"
    # a feature that lands takes its flags off this list: only fewer refusals than written here are fine
    assert set(found) <= EXPECTED_REFUSED[recipe.name], set(found) - EXPECTED_REFUSED[recipe.name]
    model_cfg, train_cfg = resolved(rest, recipe, monkeypatch)  # the rest is a valid run
    assert train_cfg.global_batch_size and train_cfg.train_iters


def _plain(value):
    return value[0] if isinstance(value, list) and len(value) == 1 else value


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_no_recipe_flag_is_silently_ignored(recipe, monkeypatch):
    """Each flag lands in a config field, and one that the resolved configuration does not follow (taking it
    out changes nothing, yet resolve holds another value) is on the start-up line of flags without effect."""
    argv = refused(recipe.argv)[1]
    base = resolved(argv, recipe, monkeypatch)
    given = parse_args(argv)
    listed = {flag for flag, _ in no_effect.accepted(*base)}
    fields = [{f.name for f in dataclasses.fields(c)} for c in base]
    for flag, values in occurrences(argv):
        dest = _dest_of(flag)
        which = 0 if dest in fields[0] else 1
        assert dest in fields[which], f"{flag} has no config field"
        if flag in listed:
            continue
        try:
            other = resolved(without(argv, {flag}), recipe, monkeypatch)
        except Exception:  # the rest no longer validates without it: the flag matters
            continue
        if [dataclasses.asdict(c) for c in other] != [dataclasses.asdict(c) for c in base]:
            continue  # it changes the run
        # it restates what resolve derives anyway (e.g. --kv-channels hidden / heads), or it was overridden
        assert _plain(getattr(given[which], dest)) == _plain(getattr(base[which], dest)), \
            f"{recipe.name}: {flag} {' '.join(values)} is overridden and not listed as without effect"


def _field_names():
    from megatron.core.config import TransformerConfig
    from megatron.training.config.training_config import TrainingConfig
    return {f.name for cls in (TransformerConfig, TrainingConfig) for f in dataclasses.fields(cls)}


def test_every_config_field_is_read_somewhere():
    """A field no code reads is a flag silently ignored: each name appears as an attribute read outside the
    config definitions (megatron/, pretrain_*.py, tools/)."""
    sources = []
    for root in ("megatron", "tools"):
        for dirpath, _, files in os.walk(os.path.join(REPO, root)):
            sources += [os.path.join(dirpath, f) for f in files if f.endswith(".py")]
    sources += [os.path.join(REPO, f) for f in os.listdir(REPO) if f.startswith("pretrain_")]
    text = "\n".join(open(p).read() for p in sources)
    unread = [n for n in sorted(_field_names()) if not re.search(r"\." + n + r"\b(?!\s*=[^=])", text)]
    assert not unread, unread


def table(known=None):
    """Rows (recipe, flag uses, accepted, accepted-no-effect, refused) with the refused flags by reason."""
    known = known or _known()
    rows = []
    for recipe in RECIPES:
        uses = occurrences(recipe.argv)
        found, rest = refused(recipe.argv)
        model_cfg, train_cfg = parse_args(rest)
        listed = {flag for flag, _ in no_effect.accepted(model_cfg, train_cfg)}
        nope = [f for f, _ in occurrences(rest) if f in listed]
        refused_flags = len(uses) - len(occurrences(rest))
        reasons = {FEATURES[k][0]: v for k, v in found.items()}
        rows.append((recipe.name, len(uses), len(occurrences(rest)) - len(nope), len(nope), refused_flags, reasons))
    return rows


if __name__ == "__main__":
    print("| recipe | flag uses | accepted | accepted, no effect | refused | refused for |")
    print("|---|---|---|---|---|---|")
    total = [0, 0, 0, 0]
    for name, n, ok, nope, bad, reasons in table():
        why = "; ".join(f"{k} ({len(v)})" for k, v in reasons.items())
        print(f"| {name} | {n} | {ok} | {nope} | {bad} | {why} |")
        total = [t + x for t, x in zip(total, (n, ok, nope, bad))]
    print("| total | " + " | ".join(map(str, total)) + " | |")
