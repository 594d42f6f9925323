"""The capacity rule over a micro-batch that several ranks route in parts (context parallelism, MoE
parallel folding): the parts' keep masks are the whole micro-batch's, each token's row in it is where
the CP chunks and TP slices put it, and the padded expert input counts the micro-batches that reach it."""
import pytest
import torch

from megatron.core.parallel_layout import ParallelLayout
from megatron.core.transformer.context_parallel import slice_sequence
from megatron.core.transformer.moe.capacity import capacity, keep_over_capacity
from megatron.core.transformer.moe.token_share import TokenShare, token_share


@pytest.mark.parametrize("policy", ["probs", "position"])
def test_the_rule_on_shuffled_parts_is_the_whole_micro_batchs(policy):
    gen = torch.Generator().manual_seed(0)
    T, k, E = 48, 2, 4
    probs = torch.rand(T, k, generator=gen)
    probs[5, 1] = probs[9, 0]  # a tie: the earlier pair wins in both orders
    indices = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    cap = capacity(T, k, E, 0.5)
    whole = keep_over_capacity(probs, indices, E, cap, policy)
    dropped = int((~whole).sum())
    assert dropped >= T * k // 2, dropped  # factor 0.5: at least half the pairs cannot fit
    perm = torch.randperm(T, generator=gen)  # the parts gathered in rank order: rows in another order
    parts = keep_over_capacity(probs[perm], indices[perm], E, cap, policy, rows=perm)
    assert torch.equal(parts, whole[perm])
    assert torch.equal(keep_over_capacity(probs, indices, E, cap, policy, rows=torch.arange(T)), whole)


@pytest.mark.parametrize("cp,tp", [(2, 1), (1, 2), (2, 2), (4, 2)])
def test_rows_are_where_cp_chunks_and_tp_slices_put_the_tokens(cp, tp):
    S, b = 32, 3
    place = (torch.arange(S)[:, None] * b + torch.arange(b)).view(S, b)  # [s, b]: each token's row
    seen = []
    for c in range(cp):
        mine = slice_sequence(place, 0, c, cp)  # the CP rank's chunks, then the TP rank's slice (folding.py)
        for t in range(tp):
            share = TokenShare(c, cp, t, tp)
            rows = share.rows(S // (cp * tp), b)
            assert torch.equal(rows, mine.chunk(tp, 0)[t].reshape(-1)), (c, t)
            seen.append(rows)
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(S * b))


def _sources(ranks, micro_batch):
    return len({micro_batch(r) for r in ranks})


@pytest.mark.parametrize("tp,cp,dp,etp,ep", [(2, 1, 1, 1, 2), (2, 2, 1, 1, 2), (2, 1, 2, 1, 4), (1, 1, 2, 2, 1),
                                             (2, 1, 2, 4, 1), (2, 1, 3, 1, 3), (4, 1, 1, 2, 2)])
def test_sources_count_the_micro_batches_reaching_an_expert_folded(tp, cp, dp, etp, ep):
    layout = ParallelLayout(tp * cp * dp, tp=tp, cp=cp, ep=ep, etp=etp)
    ep_lists, etp_lists = layout.rank_lists("ep"), layout.rank_lists("etp")
    feeding = {r: sorted({x for g in ep_lists if r in g for y in g for e in etp_lists if y in e for x in e})
               for r in range(tp * cp * dp)}
    for r, ranks in feeding.items():
        assert token_share(layout.plan_groups(r)).sources == _sources(ranks, lambda x: x // (tp * cp)), r


@pytest.mark.parametrize("cp,dp,ep", [(1, 4, 2), (2, 1, 2), (2, 2, 4), (2, 3, 3), (4, 1, 2)])
def test_sources_count_the_micro_batches_reaching_an_expert(cp, dp, ep):
    layout = ParallelLayout(cp * dp, cp=cp, ep=ep)  # TP 1: global rank = cp + CP x dp
    for r in range(cp * dp):
        group = layout.group_of("ep", r)
        share = token_share(layout.plan_groups(r))
        assert share.sources == _sources(group, lambda x: x // cp) and share.parts == cp, r
    assert TokenShare(sources=2).padded_rows(128, 2, 4, 0.5) == 2 * capacity(128, 2, 4, 0.5)


def test_fp8_padding_per_micro_batch_is_one_process_padding_of_each():
    """FP8 experts fed by several micro-batches (EP, folding) pad their input per micro-batch: each expert's rows
    are one block of `cap` per micro-batch, in the order the micro-batches first appear, holding that micro-batch's
    rows in source order and then zeros, as one process pads that micro-batch's input. Two experts, sources from
    micro-batches [1, 0, 1] (one micro-batch's sources apart), written out by hand; more rows than `cap` raise."""
    from megatron.core.transformer.moe.capacity import pad_to_capacity, places_by_micro_batch
    by_source, labels, cap = [[2, 1, 1], [0, 3, 2]], [1, 0, 1], 3
    rows = sum(map(sum, by_source))
    x = torch.arange(1, rows + 1, dtype=torch.float32)[:, None]  # row i holds i + 1 (0: padding)
    places = places_by_micro_batch(by_source, labels, 2 * cap, cap, "cpu")
    got = pad_to_capacity(x, places, 2, 2 * cap)[:, 0].tolist()
    # expert 0: micro-batch 1 (source 0's rows 1, 2 and source 2's row 4), then micro-batch 0 (source 1's row 3)
    # expert 1: micro-batch 1 (source 2's rows 8, 9), then micro-batch 0 (source 1's rows 5, 6, 7)
    assert got == [1, 2, 4, 3, 0, 0] + [8, 9, 0, 5, 6, 7]
    with pytest.raises(ValueError, match="over its capacity 2"):
        places_by_micro_batch(by_source, labels, 4, 2, "cpu")
