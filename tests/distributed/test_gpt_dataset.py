"""GPTDataset's index cache shared by two real processes: order independent of the building rank."""
import numpy as np
import torch.distributed as dist

from megatron.core.datasets import GPTDataset, GPTDatasetConfig, IndexedDataset
from tests.data_utils import all_tokens, make_data
from tests.harness import spawn


def _build_on_one_rank(groups, prefix, cache, builder):
    """The `builder` rank builds the cache first; the other waits, then loads it."""
    cfg = GPTDatasetConfig(seq_length=16, seed=4, cache_dir=cache)
    if dist.get_rank() != builder:
        dist.barrier()
    ds = GPTDataset(IndexedDataset(prefix), np.arange(200), 120, "train", cfg)
    if dist.get_rank() == builder:
        dist.barrier()
    return ds.built, all_tokens(ds, 120)


def test_data_order_does_not_depend_on_which_rank_built_the_cache(tmp_path):
    prefix = make_data(tmp_path / "d")
    reference = all_tokens(GPTDataset(IndexedDataset(prefix), np.arange(200), 120, "train",
                                      GPTDatasetConfig(seq_length=16, seed=4)), 120)
    results = spawn(2, _build_on_one_rank, prefix, str(tmp_path / "cache"), 1)
    assert [built for built, _ in results] == [False, True]
    for _, tokens in results:
        assert np.array_equal(tokens, reference)
