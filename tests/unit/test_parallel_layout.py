"""ParallelLayout's one rank-list generator against the grid it replaced: the lists written out below were
produced by megatron/core/parallel_state.py at commit 3f64f10 for the layouts of the parity suite, and
tests/layout_reference.py keeps that code's arithmetic to compare every layout of up to 16 ranks (dense
TP/CP/DP/PP, EP, folded EP with ETP below and above TP, ZB-V's second pipeline group).

Group creation order is not compared (the unfolded expert groups are now made in the order of their first
rank, as every other kind); each group's member order is, exactly: it maps group ranks to global ranks."""
import itertools

import pytest

from megatron.core import parallel_layout
from megatron.core.errors import ParallelConfigError
from megatron.core.parallel_layout import ParallelLayout, rank_lists
from tests.layout_reference import reference

# {name: (layout kwargs, {group: rank lists as 3f64f10 built them})}
PARITY_SUITE = {
    "dense tp2 pp2 dp2": (dict(world=8, tp=2, pp=2), {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "pp": [[0, 4], [1, 5], [2, 6], [3, 7]], "mp": [[0, 1, 4, 5], [2, 3, 6, 7]],
        "embd": [[0, 4], [1, 5], [2, 6], [3, 7]]}),
    "dense pp4 vpp2": (dict(world=4, pp=4, vpp=2), {
        "tp": [[0], [1], [2], [3]], "dp": [[0], [1], [2], [3]], "pp": [[0, 1, 2, 3]], "mp": [[0, 1, 2, 3]],
        "embd": [[0, 3]]}),
    "cp2 tp2 pp2": (dict(world=8, tp=2, cp=2, pp=2), {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp": [[0], [1], [2], [3], [4], [5], [6], [7]],
        "pp": [[0, 4], [1, 5], [2, 6], [3, 7]], "mp": [[0, 1, 4, 5], [2, 3, 6, 7]],
        "embd": [[0, 4], [1, 5], [2, 6], [3, 7]], "cp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp_cp": [[0, 2], [1, 3], [4, 6], [5, 7]]}),
    "ep2 tp2 dp4": (dict(world=8, tp=2, ep=2), {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "pp": [[0], [1], [2], [3], [4], [5], [6], [7]], "mp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "embd": [[0], [1], [2], [3], [4], [5], [6], [7]], "ep": [[0, 2], [4, 6], [1, 3], [5, 7]],
        "edp": [[0, 4], [2, 6], [1, 5], [3, 7]]}),
    "ep2 cp2 dp2": (dict(world=4, cp=2, ep=2), {
        "tp": [[0], [1], [2], [3]], "dp": [[0, 2], [1, 3]], "pp": [[0], [1], [2], [3]], "mp": [[0], [1], [2], [3]],
        "embd": [[0], [1], [2], [3]], "cp": [[0, 1], [2, 3]], "dp_cp": [[0, 1, 2, 3]], "ep": [[0, 1], [2, 3]],
        "edp": [[0, 2], [1, 3]]}),
    "folded tp2 dp2 etp1 ep4": (dict(world=4, tp=2, ep=4, etp=1), {
        "tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]], "pp": [[0], [1], [2], [3]], "mp": [[0, 1], [2, 3]],
        "embd": [[0], [1], [2], [3]], "etp": [[0], [1], [2], [3]], "ep": [[0, 1, 2, 3]],
        "edp": [[0], [1], [2], [3]], "tp_cp": [[0, 1], [2, 3]]}),
    "folded tp4 etp2 ep2": (dict(world=4, tp=4, ep=2, etp=2), {
        "tp": [[0, 1, 2, 3]], "dp": [[0], [1], [2], [3]], "pp": [[0], [1], [2], [3]], "mp": [[0, 1, 2, 3]],
        "embd": [[0], [1], [2], [3]], "etp": [[0, 1], [2, 3]], "ep": [[0, 2], [1, 3]], "edp": [[0], [1], [2], [3]],
        "tp_cp": [[0, 1, 2, 3]]}),
    "folded tp2 dp2 etp4 ep1 (expert TP above TP)": (dict(world=4, tp=2, etp=4), {
        "tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]], "pp": [[0], [1], [2], [3]], "mp": [[0, 1], [2, 3]],
        "embd": [[0], [1], [2], [3]], "etp": [[0, 1, 2, 3]], "ep": [[0], [1], [2], [3]],
        "edp": [[0], [1], [2], [3]], "tp_cp": [[0, 1], [2, 3]]}),
    "zb-v pp2 dp2": (dict(world=4, pp=2, schedule="zb_v"), {
        "tp": [[0], [1], [2], [3]], "dp": [[0, 1], [2, 3]], "pp": [[0, 2], [1, 3]], "mp": [[0, 2], [1, 3]],
        "embd": [[0, 2], [1, 3]], "pp_grad": [[0, 2], [1, 3]]}),
}


def _layouts(max_world=16):
    """Every layout the old grid accepted, as (ParallelLayout kwargs, reference kwargs)."""
    for world in range(1, max_world + 1):
        for tp, cp, pp in itertools.product(range(1, world + 1), repeat=3):
            if world % (tp * cp * pp):
                continue
            for ep, etp, v in itertools.product(range(1, world + 1), [None, *range(1, world + 1)], (False, True)):
                try:
                    ParallelLayout(world, tp, cp, pp, None, ep, etp, "zb_v" if v else None)
                except ParallelConfigError:
                    continue
                yield dict(world=world, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, schedule="zb_v" if v else None), \
                    dict(world=world, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, pp_grad=v)


def _fake_build(monkeypatch, layout):
    """build_groups() on every rank of `layout` with new_group giving back the ranks it was asked for."""
    out = []
    for rank in range(layout.world):
        monkeypatch.setattr(parallel_layout.dist, "get_world_size", lambda group=None: layout.world)
        monkeypatch.setattr(parallel_layout.dist, "get_rank", lambda group=None, r=rank: r)
        monkeypatch.setattr(parallel_layout.dist, "new_group", lambda ranks: tuple(ranks))
        out.append(layout.build_groups())
    return out


@pytest.mark.parametrize("name", list(PARITY_SUITE))
def test_the_parity_suites_layouts_build_the_groups_written_down(monkeypatch, name):
    kw, want = PARITY_SUITE[name]
    layout = ParallelLayout(**kw)
    assert set(layout.built()) == set(want)
    for group, lists in want.items():
        assert sorted(layout.rank_lists(group)) == sorted(lists), group
    for rank, g in enumerate(_fake_build(monkeypatch, layout)):
        for group, lists in want.items():
            mine = [r for r in lists if rank in r]
            assert getattr(g, group) == (tuple(mine[0]) if mine else None), (rank, group)


NEWER = {"ecp"}  # groups the old grid did not have (test_expert_rows_sources_and_the_ranks_sharing_their_micro_batches)


def test_every_layout_up_to_16_ranks_has_the_old_grids_groups_and_positions():
    checked = 0
    for kw, ref_kw in _layouts():
        layout, ref = ParallelLayout(**kw), reference(**ref_kw)
        assert set(layout.built()) - NEWER == set(ref["lists"]), kw
        for group, lists in ref["lists"].items():
            assert sorted(layout.rank_lists(group)) == sorted(lists), (kw, group)
        for rank, want in enumerate(ref["ranks"]):
            g = layout.plan_groups(rank)
            for name in set(g.NAMES) - NEWER:  # membership: the group's size and this rank's index in it, or None
                h, ranks = getattr(g, name), want[name]
                assert (h is None) == (ranks is None), (kw, rank, name)
                assert h is None or (h.size, h.rank) == (len(ranks), ranks.index(rank)), (kw, rank, name)
            for field in ("tp_size", "cp_size", "dp_size", "pp_size", "ep_size", "edp_size", "etp_size", "tp_rank",
                          "cp_rank", "dp_rank", "pp_rank", "ep_rank", "edp_rank", "etp_rank", "pp_ranks"):
                assert getattr(g, field) == want[field], (kw, rank, field)
            assert g.expert_folded == want["expert_folded"]
        checked += 1
    assert checked > 4000  # every (world, tp, cp, pp, ep, etp, ZB-V) the old grid accepted


def _sources_from_positions(layout, pos, rank):
    """expert_row_sources written from grid positions: the ranks of rank's EP group (same PP, expert-TP and
    expert-DP position; ep order), and folded, the same for each expert-TP peer (same PP, EP and expert-DP)."""
    def ep_group(r):
        return sorted((q for q in range(layout.world) if (pos[q].pp, pos[q].etp, pos[q].edp) ==
                       (pos[r].pp, pos[r].etp, pos[r].edp)), key=lambda q: pos[q].ep)
    peers = [rank] if not layout.experts_folded else sorted(
        (q for q in range(layout.world) if (pos[q].pp, pos[q].ep, pos[q].edp) == (pos[rank].pp, pos[rank].ep,
                                                                                  pos[rank].edp)),
        key=lambda q: pos[q].etp)
    return [s for p in peers for s in ep_group(p)]


def test_expert_rows_sources_and_the_ranks_sharing_their_micro_batches():
    """FP8 experts cast each micro-batch's rows of an expert with one scale. expert_row_sources: the ranks whose
    tokens reach a rank's experts, from grid positions. ecp: every rank holding the same experts (same PP, TP or
    expert-TP and EP position) and rows of one of this rank's micro-batches is in this rank's ecp, and the ecp groups
    are the smallest sets closed under that; None where a rank shares with none; cp at EP 1 unfolded."""
    checked = shared = 0
    for kw, _ in _layouts():
        layout = ParallelLayout(**kw)
        pos = [layout.position(r) for r in range(layout.world)]
        batches = {}
        for rank in range(layout.world):
            sources = layout.expert_row_sources(rank)
            assert sources == _sources_from_positions(layout, pos, rank), (kw, rank)
            assert layout.expert_row_micro_batches(rank) == [pos[s].dp for s in sources]
            batches[rank] = set(layout.expert_row_micro_batches(rank))
        groups = [layout.plan_groups(r).ecp for r in range(layout.world)]
        members = {r: set(layout.group_of("ecp", r)) for r in range(layout.world)}

        def same_experts(a, b):
            return (pos[a].pp, pos[a].etp, pos[a].ep) == (pos[b].pp, pos[b].etp, pos[b].ep)
        for rank in range(layout.world):
            partners = {q for q in range(layout.world) if same_experts(rank, q) and batches[q] & batches[rank]}
            assert partners <= members[rank], (kw, rank)
            assert all(same_experts(rank, q) for q in members[rank]), (kw, rank)
            h = groups[rank]
            want = sorted(members[rank])
            assert (None if len(want) == 1 else (len(want), want.index(rank))) == (h and (h.size, h.rank)), (kw, rank)
            shared += len(want) > 1
        for rank in range(layout.world):  # smallest: each group is connected by shared micro-batches
            reach, todo = {rank}, [rank]
            while todo:
                r = todo.pop()
                for q in members[rank] - reach:
                    if batches[q] & batches[r]:
                        reach.add(q)
                        todo.append(q)
            assert reach == members[rank], (kw, rank)
        if layout.ep == 1 and not layout.experts_folded and layout.cp > 1:
            assert all(g is layout.plan_groups(r).cp or (g.size, g.rank) == (layout.plan_groups(r).cp.size,
                                                                               layout.plan_groups(r).cp.rank)
                       for r, g in enumerate(groups))
        checked += 1
    assert checked > 4000 and shared > 1000


def test_aliases_are_the_same_handles(monkeypatch):
    g = _fake_build(monkeypatch, ParallelLayout(4, tp=2))[1]  # CP 1, EP 1, not folded
    assert g.dp_cp is g.dp and g.etp is g.tp and g.edp is g.dp_cp and g.ep is None and g.cp is None
    g = _fake_build(monkeypatch, ParallelLayout(4, tp=2, etp=1, ep=2))[1]
    assert g.etp is not g.tp and g.tp_cp == (0, 1)


def test_one_generator_two_grids_of_the_same_ranks():
    assert rank_lists("a-b-c", {"a": 2, "b": 3, "c": 2}, "b") == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]]
    assert rank_lists("a-b-c", {"a": 2, "b": 3, "c": 2}, "a-c") == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]]
    layout = ParallelLayout(16, tp=2, cp=2, etp=1, ep=4)  # folded: expert-DP = 2 x 2 x 4 / 4 = 4
    assert (layout.dp, layout.dp_cp, layout.edp, layout.experts_folded) == (4, 8, 4, True)
    unfolded = ParallelLayout(16, tp=2, cp=2, ep=4)
    assert (unfolded.edp, unfolded.experts_folded, unfolded.expert_dp_apart) == (2, False, True)
    assert not ParallelLayout(16, tp=2, cp=2).expert_dp_apart


@pytest.mark.parametrize("kw,message", [
    (dict(world=6, tp=4), "world size 6 is not divisible by --tensor-model-parallel-size 4"),
    (dict(world=4, tp=0), "at least 1"),
    (dict(world=4, tp=2, vpp=2), "virtual pipeline"),
    (dict(world=4, tp=2, cp=2, pp=2), "--context-parallel-size 2 x --pipeline-model-parallel-size 2"),
    (dict(world=6, ep=4), "--expert-model-parallel-size"),
    (dict(world=2, tp=2, etp=1, ep=4), "--expert-tensor-parallel-size"),
])
def test_sizes_that_do_not_fit_are_refused_before_any_group(kw, message):
    with pytest.raises(ParallelConfigError, match=message):
        ParallelLayout(**kw)
