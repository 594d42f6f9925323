"""Each local expert's rows per source rank (TokenCounts.by_source) under expert parallelism: FP8 experts cast
each source's rows apart (one process casts each micro-batch apart), so both dispatchers must name them and hand
the rows over in (expert, source) order. Two ranks, EP2, random routing seeded per rank; the counts written out
from all ranks' routing."""
import torch

from megatron.core.transformer.moe.token_dispatcher import build_dispatcher
from tests.harness import spawn

E, K, T, H = 4, 2, 12, 3


def _dispatch(groups, dropless):
    rank, ep = groups.ep_rank, groups.ep_size
    routing = [torch.randperm(E, generator=torch.Generator().manual_seed(100 * r + t))[:K]
               for r in range(ep) for t in range(T)]  # every rank's routing, drawn alike on each
    indices = torch.stack(routing).view(ep, T, K)
    if not dropless:  # a few pairs dropped (index E), as a capacity factor drops them
        indices[:, ::5, 1] = E
    tokens = torch.arange(ep * T * H, dtype=torch.float32).view(ep, T, H)
    count = E // ep
    out = {}
    for kind in ("allgather", "alltoall"):
        d = build_dispatcher(kind, E, rank * count, count, groups.ep, by_source=True)
        x, counts = d.dispatch(tokens[rank], torch.ones(T, K), indices[rank], dropless)
        out[kind] = (x, counts.by_source, counts.sizes())
    unasked = build_dispatcher("allgather", E, rank * count, count, groups.ep)  # without FP8: nothing counted
    out["unasked"] = unasked.dispatch(tokens[rank], torch.ones(T, K), indices[rank], dropless)[1].by_source
    # written out: the rows of each of my experts from each source, in the source's token order
    expected_rows, expected = [], []
    for e in range(rank * count, (rank + 1) * count):
        per_source = []
        for r in range(ep):
            chosen = [t for t in range(T) if e in indices[r, t].tolist()]
            per_source.append(len(chosen))
            expected_rows += [tokens[r, t] for t in chosen]
        expected.append(per_source)
    return out, expected, torch.stack(expected_rows)


def test_both_dispatchers_name_each_experts_rows_per_source_in_order():
    for dropless in (True, False):
        for out, expected, rows in spawn(2, _dispatch, dropless, ep=2):
            assert out.pop("unasked") is None
            for kind, (x, by_source, sizes) in out.items():
                assert by_source == expected, (kind, dropless, by_source, expected)
                assert sizes == [sum(s) for s in expected], (kind, dropless)
                assert torch.equal(x, rows), (kind, dropless)
