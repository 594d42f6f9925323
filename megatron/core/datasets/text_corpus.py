"""The embedded default corpus: Python standard-library source, present on every machine.

Documents are the .py files under the stdlib directory (sorted, tests and site-packages
excluded) up to a byte budget. megatron/training/data/embedded.py turns them into a tokenizer
and an indexed dataset.
"""
import os
import sysconfig


def stdlib_documents(max_bytes):
    """Sorted stdlib source files as bytes, up to max_bytes in total."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                            if d not in ("site-packages", "test", "tests", "idlelib", "__pycache__"))
        paths += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    docs, total = [], 0
    for path in paths:
        with open(path, "rb") as fh:
            data = fh.read()
        if not data.strip():
            continue
        docs.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if not docs:
        raise FileNotFoundError(f"no Python source files found under {root}")
    return docs
