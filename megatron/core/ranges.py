"""Range checks of numeric configuration fields: NaN, inf and out-of-range values rejected in one line.

A rule is (interval, low, high): interval is one of "[]", "[)", "(]", "()" (closed or open at each
end); high may be math.inf (an open end: the value itself must still be finite). A field that is
None (not given) passes. Comparisons with NaN are all false, so every test is written as
"is inside" and negated, never as "is outside".
"""
import math

from .errors import ConfigError

POSITIVE = ("()", 0, math.inf)
NON_NEGATIVE = ("[)", 0, math.inf)
AT_LEAST_ONE = ("[)", 1, math.inf)
FRACTION = ("[)", 0, 1)  # Adam's betas, dropout: 1 itself would never forget or keep nothing


def inside(value, rule) -> bool:
    """Whether a finite value lies in the rule's interval."""
    interval, low, high = rule
    if not math.isfinite(value):
        return False
    above = value > low if interval[0] == "(" else value >= low
    below = value < high if interval[1] == ")" else value <= high
    return above and below


def describe(rule) -> str:
    """The allowed values in words, for the error message."""
    interval, low, high = rule
    if high == math.inf:
        if low == 0:
            return "a positive number" if interval[0] == "(" else "a non-negative (finite) number"
        return f"at least {low}" if interval[0] == "[" else f"greater than {low}"
    return f"in {interval[0]}{low}, {high}{interval[1]}"


def check_ranges(cfg, rules, flag) -> None:
    """ConfigError for the first field of cfg outside its rule (each item of a list-valued field, e.g.
    several --moe-aux-loss-coeff). rules: {field name: rule}; flag(name) -> the CLI flag named in the message."""
    for name, rule in rules.items():
        value = getattr(cfg, name)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None and not inside(item, rule):
                raise ConfigError(f"{flag(name)} must be {describe(rule)}, got {item}")
