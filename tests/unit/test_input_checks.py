"""Input checks below the CLI: the dataset's token range against the vocabulary (computed once, cached
with the indices), numeric range rules, and the writable-output probe."""
import math
import os

import numpy as np
import pytest

from megatron.core.datasets import IndexedDataset, IndexedDatasetBuilder
from megatron.core.datasets.token_range import check_token_ids, token_range
from megatron.core.errors import ConfigError, DatasetError
from megatron.core.ranges import NON_NEGATIVE, POSITIVE, inside
from megatron.training.config.output_paths import check_writable


def write(prefix, documents, dtype=np.uint16):
    builder = IndexedDatasetBuilder(str(prefix), dtype)
    for doc in documents:
        builder.add_document(np.asarray(doc), [len(doc)])
    builder.finalize()
    return IndexedDataset(str(prefix))


def test_max_id_found_anywhere_and_cached(tmp_path):
    docs = [[5, 6, 7]] * 50 + [[1, 2, 700, 3]] + [[4, 4]] * 5  # the large id sits near the end
    ds = write(tmp_path / "data", docs)
    cache = tmp_path / "cache"
    assert token_range(ds, str(cache)) == (1, 700)
    cached = [f for f in os.listdir(cache) if f.endswith("-TokenRange-min_max.npy")]
    assert len(cached) == 1
    with pytest.raises(DatasetError) as e:
        check_token_ids(ds, 300, str(cache))
    msg = str(e.value)
    assert str(tmp_path / "data") in msg and "token id 700" in msg and "size 300" in msg
    check_token_ids(ds, 701, str(cache))  # 700 < 701: fine
    # the second look reads the cache, not the .bin
    np.save(cache / cached[0], np.array([0, 9], dtype=np.int64))
    assert token_range(IndexedDataset(str(tmp_path / "data")), str(cache)) == (0, 9)


def test_negative_ids_and_empty_data(tmp_path):
    ds = write(tmp_path / "neg", [[3, -2, 4]], np.int32)
    with pytest.raises(DatasetError, match="token id -2"):
        check_token_ids(ds, 10)
    assert token_range(write(tmp_path / "empty", []), None) == (0, -1)
    check_token_ids(ds, None)  # no vocabulary: nothing to check


def test_scan_covers_every_chunk(tmp_path, monkeypatch):
    import megatron.core.datasets.token_range as tr
    monkeypatch.setattr(tr, "_CHUNK", 7)
    docs = [list(range(i, i + 5)) for i in range(0, 100, 5)]
    assert token_range(write(tmp_path / "d", docs), None) == (0, 99)


def test_range_rules():
    assert inside(0.0, NON_NEGATIVE) and not inside(-1e-9, NON_NEGATIVE)
    assert not inside(0.0, POSITIVE) and inside(1e-30, POSITIVE)
    for bad in (math.nan, math.inf, -math.inf):
        assert not inside(bad, NON_NEGATIVE)
    assert inside(0.5, ("[)", 0, 1)) and not inside(1.0, ("[)", 0, 1)) and inside(1.0, ("[]", 0, 1))


def test_check_writable(tmp_path):
    check_writable(str(tmp_path / "new" / "deeper"), "--save")  # missing folders: fine, none made
    assert not (tmp_path / "new").exists()
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="--save .* is a file"):
        check_writable(str(tmp_path / "f"), "--save")
    with pytest.raises(ConfigError, match="--pipeline-trace .*: .*f is a file"):
        check_writable(str(tmp_path / "f" / "t.json"), "--pipeline-trace", kind="file")
    with pytest.raises(ConfigError, match="is a folder"):
        check_writable(str(tmp_path), "--pipeline-trace", kind="file")
    with pytest.raises(ConfigError, match="cannot write in /proc"):
        check_writable("/proc/megatron-x", "--tensorboard-dir")
    assert os.listdir(tmp_path) == ["f"]  # the probe file is gone
