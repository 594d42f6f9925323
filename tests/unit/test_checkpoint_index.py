"""The checkpoint index (megatron/core/checkpointing/index.py): each simulated loading rank of a
GPT-shaped layout opens only the files holding its pieces and reads no more than its shard, any
layout still loads exactly, damage is caught per chunk, and checkpoints without an index load."""
import json
import os
import shutil

import pytest
import torch

from megatron.core.checkpointing import CheckpointError, CheckpointReader, IndexedReader, open_reader, read_metadata
from megatron.core.checkpointing import scale_sim as sim

LAYERS = 4
TENSORS = sim.gpt_tensors(LAYERS, 16, 1000, seq=64, vocab_multiple=8)  # vocab 1000 padded per TP


@pytest.mark.parametrize("distributed", [True, False])
def test_each_rank_reads_its_shard_only(tmp_path, distributed):
    layout = sim.Layout.of(2, 2, 2, distributed)
    path = sim.save(str(tmp_path), TENSORS, LAYERS, layout)
    for io in sim.load(path, TENSORS, LAYERS, layout):
        assert io.correct, io
        assert io.bytes_read <= 1.05 * io.shard_bytes, io
        assert io.files_opened <= io.files_holding, io
        assert io.files_holding < layout.world, io  # not every file


def test_other_layouts_load_exactly(tmp_path):
    path = sim.save(str(tmp_path), TENSORS, LAYERS, sim.Layout.of(2, 2, 2))
    for layout in (sim.Layout.of(4, 1, 2), sim.Layout.of(1, 4, 1, False)):
        for io in sim.load(path, TENSORS, LAYERS, layout):
            assert io.correct and io.files_opened <= io.files_holding, (layout, io)


def test_rng_states_come_back_through_the_index(tmp_path):
    path = sim.save(str(tmp_path), TENSORS, LAYERS, sim.Layout.of(1, 1, 2))
    reader = open_reader(path)
    assert isinstance(reader, IndexedReader)
    want = CheckpointReader(path).rng_state("rank_00001.pt")["torch"]
    assert torch.equal(reader.rng_state("rank_00001.pt")["torch"], want)


def test_checkpoint_without_index_still_loads(tmp_path):
    layout = sim.Layout.of(2, 1, 1)
    path = sim.save(str(tmp_path), TENSORS, LAYERS, layout)
    meta = read_metadata(path)
    indexed = open_reader(path, meta)
    want = {(k, s): indexed.shard(k, s, p, 1, 2) for k, p in sim.rank_params(TENSORS, LAYERS, layout, 1)
            for s in sim.STATES}
    shutil.rmtree(os.path.join(path, "index"))
    del meta["index"]  # as written before the index existed
    with open(os.path.join(path, "metadata.json"), "w") as f:
        json.dump(meta, f)
    old = open_reader(path)
    assert isinstance(old, CheckpointReader)
    for key, p in sim.rank_params(TENSORS, LAYERS, layout, 1):
        for state in sim.STATES:
            assert torch.equal(old.shard(key, state, p, 1, 2), want[(key, state)]), key


def test_damaged_bytes_are_caught_by_the_chunk_checksum(tmp_path):
    path = sim.save(str(tmp_path), TENSORS, LAYERS, sim.Layout.of(1, 1, 1))
    reader = open_reader(path)
    rule, ranks = reader.index.rules("layers.0.fc1.weight", "param")[0]
    entry = reader.index.records("layers.0.fc1.weight", "param", rule, ranks[0])[0]
    with open(os.path.join(path, entry["file"]), "r+b") as f:
        f.seek(entry["offset"] + 5)
        byte = f.read(1)
        f.seek(entry["offset"] + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    key, p = next((k, p) for k, p in sim.rank_params(TENSORS, LAYERS, sim.Layout.of(1, 1, 1), 0)
                  if k == "layers.0.fc1.weight")
    with pytest.raises(CheckpointError, match=r"rank_00000.pt: CRC-32 of bytes"):
        reader.shard(key, "param", p, 0, 1)
