"""Where a rank's router tokens sit in the micro-batch, for the capacity rule (capacity.py).

With context parallelism a CP rank holds two chunks of every sequence (context_parallel.py); with
MoE parallel folding a TP rank routes its 1/TP slice of those (folding.py). The capacity rule is one
process's over the whole micro-batch, so the router needs each local token's row in it (s-major,
s x b + b over the whole sequence) and the padded expert input needs how many micro-batches feed this
rank's experts.
"""
from dataclasses import dataclass

import torch

from ..context_parallel import local_positions
from .capacity import capacity


@dataclass(frozen=True)
class TokenShare:
    """This rank's part of the micro-batch: CP chunks cp_rank of cp_size, and, folded, slice tp_rank of
    tp_size of those (tp_size 1 when every TP rank routes all of them). sources: the micro-batches whose
    pairs reach this rank's experts (over EP, and expert-TP when folded)."""
    cp_rank: int = 0
    cp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    sources: int = 1

    @property
    def parts(self) -> int:
        """Ranks routing parts of one micro-batch (the router's token group)."""
        return self.cp_size * self.tp_size

    def rows(self, s_local: int, b: int, device=None) -> torch.Tensor:
        """[s_local x b] int64: the micro-batch row (position x b + sequence) of each local token row
        (row si x b + bi of the router's input)."""
        whole = s_local * self.parts
        pos = local_positions(whole, self.cp_rank, self.cp_size, device)
        pos = pos[self.tp_rank * s_local:(self.tp_rank + 1) * s_local]
        return (pos[:, None] * b + torch.arange(b, device=device)).reshape(-1)

    def padded_rows(self, local_tokens: int, topk: int, num_experts: int, factor: float) -> int:
        """--moe-pad-expert-input-to-capacity: rows each local expert gets, its capacity over the whole
        micro-batch (local_tokens x parts tokens) from each micro-batch that reaches it."""
        return self.sources * capacity(local_tokens * self.parts, topk, num_experts, factor)


def token_share(groups) -> TokenShare:
    """The TokenShare of this rank in `groups` (process_groups.ProcessGroups): its CP chunk and, folded, its TP
    slice (ParallelLayout.token_group); sources, the distinct micro-batches among the ranks whose tokens reach
    its experts (ParallelLayout.expert_row_micro_batches)."""
    sources = len(set(groups.layout.expert_row_micro_batches(groups.rank)))
    tp_rank, tp_size = (groups.tp_rank, groups.tp_size) if groups.layout.token_group == "tp_cp" else (0, 1)
    return TokenShare(groups.cp_rank, groups.cp_size, tp_rank, tp_size, sources)
