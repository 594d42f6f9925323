"""Pieces written under one layout (TP shards, DP flat ranges, vocab padding, stride-2
SwiGLU blocks) reassemble into the global tensor and cut into any other layout's shard."""
import pytest
import torch

from megatron.core.checkpointing import CheckpointError, assemble, local_shard, make_piece
from megatron.core.tensor_parallel.initialization import take_shard
from megatron.core.tensor_parallel.param_meta import set_init_key, set_tensor_parallel


def fake_param(shape, key, dim=None, stride=1, unpadded=None):
    p = torch.nn.Parameter(torch.empty(shape))
    set_init_key(p, key)
    if dim is not None:
        set_tensor_parallel(p, dim, stride, unpadded)
    return p


def pad(t, dim, size):
    extra = list(t.shape)
    extra[dim] = size - t.shape[dim]
    return torch.cat([t, t.new_zeros(extra)], dim=dim)


CASES = {  # name: (global unpadded shape, dim, stride, vocab-padding multiple)
    "replicated": ([6], None, 1, None),
    "column": ([8, 3], 0, 1, None),
    "row": ([3, 8], 1, 1, None),
    "swiglu-fc1": ([16, 3], 0, 2, None),
    "vocab": ([10, 3], 0, 1, 4),  # 10 rows padded to a multiple of 4 x TP
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("save_tp,save_dp,load_tp", [(2, 2, 1), (1, 3, 4), (4, 1, 2)])
def test_pieces_reassemble_and_reshard(case, save_tp, save_dp, load_tp):
    shape, dim, stride, mult = CASES[case]
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))

    def shard_param(tp):
        if dim is None:
            return fake_param(shape, case), g
        padded = -(-shape[dim] // (mult * tp)) * mult * tp if mult else shape[dim]
        local = take_shard(pad(g, dim, padded), dim, stride, 0, tp)
        return fake_param(local.shape, case, dim, stride, shape[dim] if mult else None), pad(g, dim, padded)

    pieces = []
    param, full = shard_param(save_tp)
    for r in range(save_tp if dim is not None else 1):
        flat = (take_shard(full, dim, stride, r, save_tp) if dim is not None else full).reshape(-1)
        bounds = torch.linspace(0, flat.numel(), save_dp + 1).long().tolist()  # DP flat ranges
        for lo, hi in zip(bounds, bounds[1:]):
            pieces.append(make_piece(case, "param", param, r, save_tp if dim is not None else 1, lo, hi, flat[lo:hi]))
    got = assemble(pieces, case)
    assert torch.equal(got, g)
    param, full = shard_param(load_tp)
    for r in range(load_tp):
        want = take_shard(full, dim, stride, r, load_tp) if dim is not None else g
        assert torch.equal(local_shard(got, param, r, load_tp), want)


def test_missing_piece_and_wrong_shape_are_errors():
    p = fake_param([4, 3], "w", 0)
    g = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    pieces = [make_piece("w", "param", p, 0, 2, 0, 12, take_shard(g, 0, 1, 0, 2))]
    with pytest.raises(CheckpointError, match="12 of 24 elements of 'w'"):
        assemble(pieces, "'w'")
    with pytest.raises(CheckpointError, match=r"'w' has shape \[8, 3\], the model expects \[6, 3\]"):
        local_shard(g, fake_param([3, 3], "w", 0), 0, 2)
