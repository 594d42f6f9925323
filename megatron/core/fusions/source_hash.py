"""The fingerprint of the fused kernels' sources (csrc/fused), shared by setup.py and the loader.

A module built from other sources than the checkout's must not be used: its kernels may
compute something else, or take other arguments. The build passes the hash of the sources
to the compiler (define_flag()), the module exposes it as SOURCE_HASH, and the loader
(_ext.py) compares it with the hash of the files it finds. Standard library only: setup.py
loads this file by path, before anything is installed.
"""
import glob
import hashlib
import os

PATTERNS = ("*.cu", "*.cuh", "*.h", "*.cpp")
MACRO = "MEGATRON_FUSED_SOURCE_HASH"  # read by csrc/fused/source_hash.h


def hashed_files(root):
    """The files the hash covers: every kernel source and header, and the binding files (sorted;
    not cpu_stub/, which the module never contains)."""
    return sorted({f for pattern in PATTERNS for f in glob.glob(os.path.join(root, pattern))})


def source_hash(root):
    """sha256 (64 hex digits) of the names and bytes of hashed_files(root); None when there are none.

    Independent of file times and of the order the file system lists them in; changes with any
    byte of any of them, and with a file added, removed or renamed.
    """
    files = hashed_files(root)
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        name = os.path.basename(path).encode()
        for part in (name, data):  # length-prefixed: no two file sets give the same byte stream
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()


def define_flag(root):
    """The compiler flag that bakes source_hash(root) into the module: a bare token (hex digits),
    because a quoted string is not passed alike through setuptools' and ninja's command lines."""
    return f"-D{MACRO}={source_hash(root)}"
