"""No import cycles inside the package: a lazy import inside a function is how a loop hides, so
imports anywhere in a module count."""
import ast
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules():
    """{dotted name: (path, is_package)} of every module under megatron/; a compiled extension
    (helpers_cpp.*.so) is a module without a path: it imports nothing of ours."""
    found = {}
    for folder, _, files in os.walk(os.path.join(REPO, "megatron")):
        for name in files:
            if name.endswith((".so", ".pyd")):
                rel = os.path.relpath(os.path.join(folder, name.split(".")[0]), REPO).split(os.sep)
                found[".".join(rel)] = (None, False)
            elif name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), REPO)[:-3].split(os.sep)
                package = rel[-1] == "__init__"
                found[".".join(rel[:-1] if package else rel)] = (os.path.join(folder, name), package)
    # an extension setup.py declares is a module whether or not this checkout has built it: unbuilt,
    # `from . import helpers_cpp` would otherwise resolve to the package and draw a false cycle
    with open(os.path.join(REPO, "setup.py")) as fh:
        for name in re.findall(r'Extension\(\s*"(megatron\.[\w.]+)"', fh.read()):
            found.setdefault(name, (None, False))
    return found


def _target(modules, base, name):
    """The module an import of `name` from `base` runs: the submodule if there is one, else base."""
    full = f"{base}.{name}" if base and name else base or name
    return full if full in modules else base if base in modules else None


def import_graph():
    """{module: set of megatron modules it imports}, counting imports inside functions."""
    modules, graph = _modules(), {}
    for mod, (path, package) in modules.items():
        here = mod if package else mod.rpartition(".")[0]
        edges = graph.setdefault(mod, set())
        if path is None:
            continue
        with open(path) as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [_target(modules, a.name, "") for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = here.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [_target(modules, base, a.name) for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t and t.startswith("megatron") and t != mod)
    return graph


def find_cycles(graph):
    """Every edge (a, b) that lies on a cycle, as sorted pairs of the strongly connected parts."""
    index, low, stack, on_stack, parts = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                parts.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return {tuple(sorted((a, b))) for part in parts for a in part for b in graph[a] if b in part}


def test_the_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "megatron.core.errors" in graph["megatron.core.config"]
    assert "megatron.core.config" in graph["megatron.core.fusions"]  # imported inside check_config


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (each pair imports the other, directly or around a loop): " + \
        "; ".join(f"{a} <-> {b}" for a, b in sorted(cycles))


def test_a_cycle_is_found():
    with pytest.raises(AssertionError):
        assert not find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}})
