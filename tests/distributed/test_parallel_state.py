"""The rank grid on 8 real processes: documented order and group membership."""
import torch.distributed as dist

from tests.harness import spawn


def _members(groups):
    def ranks(g):
        return sorted(dist.get_global_rank(g, i) for i in range(dist.get_world_size(g)))
    return {"tp": ranks(groups.tp), "dp": ranks(groups.dp), "pp": ranks(groups.pp),
            "mp": ranks(groups.mp), "embd": ranks(groups.embd),
            "pos": (groups.tp_rank, groups.dp_rank, groups.pp_rank),
            "first_last": (groups.is_first_stage, groups.is_last_stage)}


def test_grid_tp2_pp2_dp2_matches_documented_order():
    got = spawn(8, _members, tp=2, pp=2)
    tp_groups = {0: [0, 1], 2: [2, 3], 4: [4, 5], 6: [6, 7]}
    for rank, m in enumerate(got):
        assert m["tp"] == tp_groups[rank - rank % 2]
        assert m["dp"] == [[0, 2], [1, 3], [0, 2], [1, 3], [4, 6], [5, 7], [4, 6], [5, 7]][rank]
        assert m["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]][rank % 4]
        assert m["mp"] == ([0, 1, 4, 5] if rank in (0, 1, 4, 5) else [2, 3, 6, 7])
        assert m["embd"] == m["pp"]  # first and last stage
        t, d, p = m["pos"]
        assert t + 2 * (d + 2 * p) == rank  # tp-dp-pp, TP fastest
        assert m["first_last"] == (p == 0, p == 1)
