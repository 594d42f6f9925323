"""--moe-layer-freq as Megatron-LM takes it: an integer N (every N-th layer is an MoE layer, from the
first), or a Python list expression with one 0 (dense) or 1 (MoE) per layer, e.g. "([1]*3+[0])*2".

Megatron-LM evaluates the expression with eval() after checking its characters; here only the
grammar it allows is evaluated (integers, lists of integers, +, *, parentheses), with ast.
"""
import ast
import re

_ALLOWED = re.compile(r"^[\s,\d\[\]()+*]+$")


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Add) and type(left) is type(right):
            return left + right
        if isinstance(node.op, ast.Mult) and (isinstance(left, int) or isinstance(right, int)):
            return left * right
    raise ValueError("not a list expression of 0s and 1s")


def moe_freq(text):
    """'N' -> N; a list expression -> its list of 0/1 (argparse type: ValueError for anything else)."""
    text = str(text).strip().strip("'\"")
    if text.lstrip("-").isdigit():
        return int(text)
    if not _ALLOWED.match(text):
        raise ValueError(f"invalid --moe-layer-freq {text!r}")
    value = _value(ast.parse(text, mode="eval").body)
    if not isinstance(value, list) or any(v not in (0, 1) for v in value):
        raise ValueError(f"--moe-layer-freq {text!r} must give a list of 0s and 1s")
    return value


def every_n(pattern, num_layers):
    """N where `pattern` (one 0/1 per layer) is MoE exactly on layers 1, N + 1, 2N + 1, ...; else None."""
    if len(pattern) != num_layers or not pattern or pattern[0] != 1:
        return None
    ones = [i for i, v in enumerate(pattern) if v]
    n = ones[1] if len(ones) > 1 else num_layers
    return n if pattern == [int(i % n == 0) for i in range(num_layers)] else None
