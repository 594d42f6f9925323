"""The fault injector's actions added for issue 41 (megatron/core/debug.py): eio, corrupt, nan (returned to
the caller) and the attempt field (torchrun's restart count), each matched and not matched."""
import errno

import pytest

from megatron.core import debug


def test_eio_raises_an_io_error(monkeypatch):
    monkeypatch.setenv(debug.FAULT_ENV, "ckpt.begin:3::eio")
    debug.fault_point("ckpt.begin", 2, 0)
    with pytest.raises(OSError) as e:
        debug.fault_point("ckpt.begin", 3, 0)
    assert e.value.errno == errno.EIO and "injected at ckpt.begin" in str(e.value)


def test_nan_is_returned_to_the_caller_only_where_it_matches(monkeypatch):
    monkeypatch.setenv(debug.FAULT_ENV, "train.grads:5:1:nan")
    assert debug.fault_point("train.grads", 5, 1) == "nan"
    assert debug.fault_point("train.grads", 5, 0) is None and debug.fault_point("train.grads", 4, 1) is None


def test_the_attempt_field_matches_torchruns_restart_count(monkeypatch):
    monkeypatch.setenv(debug.FAULT_ENV, "train.grads:5::nan:0")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert debug.fault_point("train.grads", 5, 0) == "nan"  # a first launch is attempt 0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert debug.fault_point("train.grads", 5, 0) is None


def test_corrupt_overwrites_the_middle_of_the_named_file(monkeypatch, tmp_path):
    path = tmp_path / "rank_00000.pt"
    path.write_bytes(bytes(range(256)) * 64)
    monkeypatch.setenv(debug.FAULT_ENV, "ckpt.rank_file.after:2:0:corrupt")
    debug.fault_point("ckpt.rank_file.after", 2, 0, path=str(path))
    data = path.read_bytes()
    assert len(data) == 256 * 64 and data.count(b"\xab" * 4096) == 1 and data[:1024] == bytes(range(256)) * 4
    with pytest.raises(ValueError, match="names no file"):
        debug.fault_point("ckpt.rank_file.after", 2, 0)
