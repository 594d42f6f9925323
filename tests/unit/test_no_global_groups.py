"""Layers get their groups passed in: no module under megatron/core/transformer or
megatron/core/tensor_parallel reads groups from a global (parallel_state, or a module holding groups
for everyone). Read from the source, so a lazy import inside a function counts too."""
import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("megatron/core/transformer", "megatron/core/tensor_parallel")
GLOBAL_MODULES = {"parallel_state"}  # where groups used to live for everyone to read
GLOBAL_NAMES = {"_GROUPS", "get_process_groups", "initialize_model_parallel"}


def _sources():
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, name), REPO)


def global_group_reads(path):
    """[(line, what)] of the imports and names in `path` that reach the global groups."""
    with open(os.path.join(REPO, path)) as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")
            names = {a.name for a in node.names}
            if GLOBAL_MODULES & (set(module) | names) or GLOBAL_NAMES & names:
                found.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import {', '.join(names)}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if GLOBAL_MODULES & set(a.name.split("."))]
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in GLOBAL_NAMES:
                found.append((node.lineno, name))
    return found


def test_layers_read_no_global_groups():
    paths = list(_sources())
    assert len(paths) > 30  # the walk found the packages
    found = {p: hits for p in paths if (hits := global_group_reads(p))}
    assert not found, f"global groups read in layer code (pass the groups in instead): {found}"


def test_the_check_sees_a_lazy_import_and_a_call(tmp_path, monkeypatch):
    bad = tmp_path / "megatron" / "core" / "transformer"
    bad.mkdir(parents=True)
    (bad / "x.py").write_text("def f():\n    from ..parallel_state import get_process_groups\n"
                              "    return get_process_groups().tp\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    assert [line for line, _ in global_group_reads("megatron/core/transformer/x.py")] == [2, 3]
