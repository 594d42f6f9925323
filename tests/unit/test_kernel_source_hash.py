"""A prebuilt kernel module is used only when it was built from the checkout's sources.

The hash of csrc/fused (source_hash.py) is stable and follows every byte of the files it
covers; the module carries it as SOURCE_HASH (csrc/fused/source_hash.h turns the compiler flag
into a string, checked here with the host compiler); the loader's decision is checked with fake
modules standing in for the prebuilt and the freshly built one.
"""
import os
import shutil
import subprocess
import sys
import types

import pytest

from megatron.core.fusions import _ext
from megatron.core.fusions.source_hash import MACRO, define_flag, hashed_files, source_hash


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "fused"
    shutil.copytree(_ext.CSRC, root)
    return root


def test_hash_covers_the_sources_and_headers():
    names = {os.path.basename(f) for f in hashed_files(_ext.CSRC)}
    assert {"bindings.cpp", "common.cuh", "fused_kernels.h", "source_hash.h", "softmax.cu", "rope.cu"} <= names
    assert {os.path.basename(f) for f in _ext.sources()} <= names


def test_hash_is_stable(tree):
    h = source_hash(_ext.CSRC)
    assert len(h) == 64 and int(h, 16) >= 0
    assert source_hash(tree) == h == source_hash(_ext.CSRC)  # other directory, other file times
    os.utime(tree / "softmax.cu", (0, 0))
    (tree / "notes.txt").write_text("not a source")
    (tree / "softmax.cu.o").write_bytes(b"\0")
    assert source_hash(tree) == h
    assert define_flag(tree) == f"-D{MACRO}={h}"


@pytest.mark.parametrize("name", ["softmax.cu", "common.cuh", "fused_kernels.h", "bindings.cpp", "source_hash.h"])
def test_hash_changes_with_one_byte(tree, name):
    before = source_hash(tree)
    path = tree / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert source_hash(tree) != before


def test_hash_changes_with_files_added_removed_renamed(tree):
    before = source_hash(tree)
    (tree / "extra.cu").write_text("")
    added = source_hash(tree)
    os.remove(tree / "extra.cu")
    assert source_hash(tree) == before
    os.rename(tree / "rope.cu", tree / "rope2.cu")
    assert len({before, added, source_hash(tree)}) == 3
    assert source_hash(tree / "missing") is None


@pytest.mark.parametrize("value", ["0123456789abcdef" * 4, "e" + "0" * 63, "1e99" + "f" * 60])
def test_header_turns_the_flag_into_the_string(tmp_path, value):
    """The flag is a bare token through setuptools and ninja alike; the header stringifies it."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "probe.cpp"
    src.write_text('#include <cstdio>\n#include "source_hash.h"\n'
                   "int main() { std::puts(MEGATRON_FUSED_SOURCE_HASH_STRING); }\n")
    for flags, expected in (([f"-D{MACRO}={value}"], value), ([], "unknown")):
        exe = tmp_path / "probe"
        subprocess.run([cxx, f"-I{_ext.CSRC}", *flags, str(src), "-o", str(exe)], check=True, timeout=120)
        assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip() == expected


# ----------------------------------------------------------------------------- load decision


def _module(source_hash_value):
    m = types.ModuleType(_ext.NAME)
    if source_hash_value is not None:
        m.SOURCE_HASH = source_hash_value
    return m


@pytest.fixture
def loader(monkeypatch):
    """Run _ext._find with a fake prebuilt module (or none) and a fake build; records builds."""
    builds = []

    def run(prebuilt, built=None, build_error="nvcc exploded", csrc=None):
        if csrc is not None:
            monkeypatch.setattr(_ext, "CSRC", str(csrc))
        if prebuilt is None:
            monkeypatch.setitem(sys.modules, _ext.NAME, None)  # import raises ImportError
        else:
            monkeypatch.setitem(sys.modules, _ext.NAME, prebuilt)

        def build():
            builds.append(1)
            return (built, "built on first use (cached)") if built is not None else (None, build_error)
        monkeypatch.setattr(_ext, "_build", build)
        return _ext._find()

    run.builds = builds
    return run


def _warnings(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_matching_prebuilt_is_used(loader, capsys):
    prebuilt = _module(source_hash(_ext.CSRC))
    assert loader(prebuilt) == (prebuilt, "prebuilt by setup.py")
    assert loader.builds == [] and _warnings(capsys) == []
    assert sys.modules[_ext.NAME] is prebuilt


@pytest.mark.parametrize("old", ["0" * 64, None], ids=["other sources", "built before the hash"])
def test_stale_prebuilt_is_rebuilt_with_one_warning(loader, capsys, old):
    fresh, stale = _module(source_hash(_ext.CSRC)), _module(old)
    module, status = loader(stale, built=fresh)
    assert module is fresh and loader.builds == [1]
    assert status == "built on first use (cached); replaced a stale setup.py build"
    assert sys.modules.get(_ext.NAME) is not stale  # dropped, so the build's import is not shadowed
    (line,) = _warnings(capsys)
    assert line.startswith("warning: fused kernels: the module setup.py built is stale") and "rebuilt it" in line


def test_stale_prebuilt_and_failed_rebuild_fall_back_to_torch(loader, capsys):
    module, status = loader(_module("0" * 64), built=None)
    assert module is None and status == "unavailable: nvcc exploded"
    (line,) = _warnings(capsys)
    assert "stale" in line and line.endswith("plain torch runs instead (nvcc exploded)")


def test_no_prebuilt_builds_quietly(loader, capsys):
    fresh = _module(source_hash(_ext.CSRC))
    assert loader(None, built=fresh) == (fresh, "built on first use (cached)")
    assert loader.builds == [1] and _warnings(capsys) == []


def test_build_of_other_sources_is_refused(loader, capsys):
    module, status = loader(None, built=_module("f" * 64))
    assert module is None and status.startswith("unavailable: the module built reports source hash ffffffffffff")
    (line,) = _warnings(capsys)
    assert line.startswith("warning: fused kernels: plain torch runs instead")


def test_without_sources_the_prebuilt_is_trusted(loader, tmp_path, capsys):
    prebuilt = _module("0" * 64)
    assert loader(prebuilt, csrc=tmp_path / "absent") == (prebuilt, "prebuilt by setup.py")
    assert loader.builds == [] and _warnings(capsys) == []
