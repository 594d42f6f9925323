"""Scale limits of the checkpoint loader: the piece lookup is O(pieces) whatever the tensor's
element count, and it inverts the sharding rule exactly (strides, vocabulary padding, DP ranges);
an error in training waits for an --async-save save in flight."""
import json
import math
import os
import shutil
import time
import tracemalloc

import pytest
import torch
import torch.distributed as dist

from megatron.core.checkpointing import AsyncSaver, IndexedReader, finishing_saves, read_metadata
from megatron.core.checkpointing import scale_sim as sim
from megatron.core.checkpointing.index import write_index_json
from megatron.core.checkpointing.index_reader import ParsedIndex, PieceTable, placement_index
from megatron.core.checkpointing.storage import _write_durable
from megatron.core.tensor_parallel.initialization import take_shard


def _pieces(shape, dim, stride, padded, tp, dp):
    """Index entries (placement only, no bytes) of a tensor saved by TP x DP ranks, each DP rank
    a flat 1/DP range of its TP shard (the distributed optimizer's pieces)."""
    local = math.prod(shape) // shape[dim] * padded // tp if dim is not None else math.prod(shape)
    return [{"key": "w", "state": "param", "shape": shape, "dim": dim, "stride": stride, "padded": padded,
             "tp_rank": r, "tp_size": tp, "lo": local * d // dp, "hi": local * (d + 1) // dp}
            for r in range(tp) for d in range(dp)]


def _table(pieces):
    return PieceTable(ParsedIndex({"pieces": pieces, "rng": {}}), "w", "param")


def test_lookup_does_not_grow_with_elements():
    # a real embedding: vocab 153,600 x hidden 4,096 = 629M elements (7.5 GB as the old element map)
    pieces = _pieces([153600, 4096], 0, 1, 153600, 8, 4)
    tracemalloc.start()
    table = _table(pieces)
    g = torch.tensor([0, 4096 * 19200 - 1, 4096 * 19200, 153600 * 4096 - 1])
    who, pos = table.find(g)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # only the pieces of the TP shards touched are loaded (TP ranks 0, 1, 7: 4 DP pieces each)
    assert len(table) == 12 and peak < 2**20, (len(table), peak)
    got = [(table.entries[w]["tp_rank"], table.entries[w]["lo"]) for w in who.tolist()]
    # element 0 -> TP rank 0 DP 0; the last of TP rank 0 -> its DP 3; the next -> TP rank 1's first
    quarter = 4096 * 19200 // 4
    assert got == [(0, 0), (0, 3 * quarter), (1, 0), (7, 3 * quarter)]
    assert pos.tolist() == [0, quarter - 1, 0, quarter - 1]


@pytest.mark.parametrize("shape,dim,stride,padded,tp,dp", [
    ([1000, 6], 0, 1, 1008, 4, 3),   # vocabulary padding
    ([24, 10], 0, 3, 24, 2, 2),      # fused QKV: 3 blocks, each split TP ways
    ([5, 16], 1, 2, 16, 4, 1),       # row-parallel split on dim 1 with stride
    ([7, 3], None, 1, None, 1, 3),   # replicated
])
def test_find_inverts_every_placement(shape, dim, stride, padded, tp, dp):
    pieces = _pieces(shape, dim, stride, padded, tp, dp)
    table = _table(pieces)
    seen = torch.zeros(math.prod(shape), dtype=torch.int64)
    full = torch.arange(math.prod(shape)).view(shape)
    if dim is not None:  # the reference: take_shard of the padded tensor of global indices
        pad = list(shape)
        pad[dim] = padded - shape[dim]
        full = take_shard(torch.cat([full, full.new_full(pad, -1)], dim), dim, stride, 0, tp)
    assert torch.equal(placement_index(shape, dim, stride, padded, 0, tp), full.reshape(-1))
    for e in pieces:
        g = placement_index(e["shape"], dim, stride, padded, e["tp_rank"], tp, e["lo"], e["hi"])
        real = g >= 0
        who, pos = table.find(g[real])
        assert all(table.entries[w] is e for w in who.tolist()), e
        assert torch.equal(pos, torch.arange(len(g))[real]), e
        seen[g[real]] += 1
    assert bool((seen == 1).all())  # every element in exactly one piece


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_training_error_waits_for_the_save_in_flight(one_rank_group, tmp_path, capfd):
    saver, done = AsyncSaver(), tmp_path / "committed"

    def slow_save():
        time.sleep(0.5)
        done.write_text("ok")

    with pytest.raises(RuntimeError, match="training broke"), finishing_saves():
        saver.submit(slow_save)
        raise RuntimeError("training broke")
    assert done.exists() and not saver.in_flight  # the save committed before the error left
    assert "waiting for it to commit" in capfd.readouterr().err


def _as_format_1(path):
    """Rewrite a checkpoint's per-tensor index files as the one index.json of format 1."""
    meta = read_metadata(path)
    reader = IndexedReader(path, meta)
    pieces = [e for k in reader.keys("param") for s in sim.STATES for rule, ranks in reader.index.rules(k, s)
              for r in ranks for e in reader.index.records(k, s, rule, r)]
    rng = {n: reader.index.rng(n) for n in meta["files"]}
    meta["index"] = write_index_json(path, pieces, rng, _write_durable)
    shutil.rmtree(os.path.join(path, "index"))
    with open(os.path.join(path, "metadata.json"), "w") as f:
        json.dump(meta, f)


def test_a_rank_reads_only_its_tensors_index_entries(tmp_path):
    layers, layout = 8, sim.Layout.of(2, 4, 2)
    tensors = sim.gpt_tensors(layers, 16, 1000, seq=64, vocab_multiple=8)
    path = sim.save(str(tmp_path), tensors, layers, layout)
    new = sim.load(path, tensors, layers, layout)
    _as_format_1(path)  # an older checkpoint: still loads, but every rank reads the whole index
    old = sim.load(path, tensors, layers, layout)
    assert all(io.correct for io in new + old)
    whole = read_metadata(path)["index"]["size"]
    assert all(io.index_bytes == whole for io in old)
    # a stage holds 1/4 of the layers, a TP rank reads 1 of 2 TP shards' entries: well under 1/4
    assert max(io.index_bytes for io in new) < whole / 4, ([io.index_bytes for io in new], whole)
    assert [io.bytes_read for io in new] == [io.bytes_read for io in old]
