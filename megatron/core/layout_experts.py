"""The expert half of ParallelLayout (a mixin of it, kept apart for length): where each rank's expert rows come
from and which ranks share a micro-batch's rows (ecp). Everything here is derived from the two grids of
parallel_layout.py; nothing outside the layout repeats it."""
from __future__ import annotations

import functools


class ExpertRows:
    """Mixed into ParallelLayout: needs its rank_lists, position and experts_folded."""

    # ---- who routes which tokens
    @property
    def token_group(self) -> str:
        """The group whose ranks route parts of one micro-batch (an MoE router's statistics and drops span it):
        CP, and folded TP x CP, each TP rank then routing its own share of the tokens."""
        return "tp_cp" if self.experts_folded else "cp"

    @property
    def routing_groups(self) -> tuple[str, ...]:
        """The groups over which a pipeline stage's ranks route different tokens (router losses add up over
        them): DP x CP, and TP when folded."""
        return ("dp_cp", "tp") if self.experts_folded else ("dp_cp",)

    # ---- where an expert's rows come from (FP8 experts cast each micro-batch's rows with one scale)
    def expert_row_sources(self, rank: int) -> list[int]:
        """The ranks whose tokens reach `rank`'s experts, in the order their rows stand in each expert's input:
        its EP group (itself at EP 1); folded, each expert-TP peer's EP group in turn (folding.ExpertTPGather
        gathers them in that order). Not folded, the TP peers hold the same rows (tokens replicated over TP)."""
        return self._expert_rows[0][rank]

    def expert_row_micro_batches(self, rank: int) -> list[int]:
        """The micro-batch of each of expert_row_sources(rank), as its DP position (the TP and CP ranks of one
        DP position hold parts of one micro-batch)."""
        return self._expert_rows[1][rank]

    @functools.cached_property
    def _expert_rows(self) -> tuple[list[list[int]], list[list[int]]]:
        """expert_row_sources and expert_row_micro_batches of every rank (computed once: O(world x sources))."""
        ep_of, etp_of = {}, {}
        for kind, table in (("ep", ep_of), ("etp", etp_of)):
            for ranks in self.rank_lists(kind):
                for r in ranks:
                    table[r] = ranks
        dp = [self.position(r).dp for r in range(self.world)]
        sources = [[s for p in (etp_of[r] if self.experts_folded else [r]) for s in ep_of[p]]
                   for r in range(self.world)]
        return sources, [[dp[s] for s in row] for row in sources]

    @functools.cached_property
    def _ecp_lists(self) -> list[list[int]]:
        """Each expert-DP group (the ranks holding the same experts) cut into the sets of ranks whose experts
        receive rows of a common micro-batch, closed under sharing: one micro-batch's rows of an expert lie
        on the ranks of one set, so FP8 experts reduce each micro-batch's amax over it."""
        out = []
        for ranks in self.rank_lists("edp"):
            batches = {r: set(self.expert_row_micro_batches(r)) for r in ranks}
            parts = []
            for r in ranks:
                joined = [p for p in parts if any(batches[r] & batches[q] for q in p)]
                parts = [p for p in parts if p not in joined] + [sorted({r}.union(*joined))]
            out += parts
        return sorted(out)

    @property
    def experts_hold_whole_micro_batches(self) -> bool:
        """Each micro-batch's rows of an expert all reach one rank (no ecp partner anywhere): blockwise FP8
        experts need it, their weight-gradient tiles running along the rows."""
        return all(len(r) == 1 for r in self._ecp_lists)

    def _ecp_alias(self, built) -> str | None:
        """Where ecp is not a group of its own: "" when every set is one rank, else the name of the built group
        (cp, tp_cp) with the same ranks; None when ecp must be built."""
        if self.experts_hold_whole_micro_batches:
            return ""
        return next((n for n in ("cp", "tp_cp") if n in built and sorted(self.rank_lists(n)) == self._ecp_lists),
                    None)
