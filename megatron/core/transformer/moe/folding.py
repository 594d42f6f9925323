"""MoE parallel folding (expert TP != TP): each TP rank routes its own share of the tokens, and
the experts' tokens are gathered over the expert-TP group and their outputs reduce-scattered back.

The grid is parallel_state's folded expert grid (ETP fastest, then EP, then expert-DP, over the
TP x CP x DP ranks of a stage). The token share of a TP rank is its sequence-parallel chunk; without
sequence parallelism it is cut out of the replicated tokens here and the outputs are all-gathered
over TP at the end (the compute after the layer is replicated over TP).
"""
import torch
import torch.nn.functional as F

from ... import comm
from ...tensor_parallel import mappings
from .token_counts import TokenCounts


def own_tokens(hidden, tp_group, sequence_parallel):
    """[s, b, h] replicated over TP (or [s/TP, b, h] with sequence parallelism) -> this TP rank's
    [s/TP, b, h]: the slice along s (backward: the slices' gradients all-gathered over tp_group)."""
    if sequence_parallel:
        return hidden
    return mappings.scatter_to_sequence_parallel_region(hidden, tp_group)


def all_tokens(out, tp_group, sequence_parallel):
    """own_tokens' inverse: [s/TP, b, h] -> [s, b, h] all-gathered over tp_group (backward: this rank's
    slice of the replicated gradient), or unchanged with sequence parallelism."""
    if sequence_parallel:
        return out
    return mappings.gather_from_sequence_parallel_region(out, tp_group, False)


class ExpertTPGather:
    """The pairs each expert-TP rank received (sorted by local expert, counts per expert), gathered
    over the expert-TP group `group` so that every rank runs its shard of each expert on all of them;
    scatter() sums the rank's partial outputs over the group and returns this rank's rows.

    Ranks receive different numbers of rows: each pads its rows to the largest count before the
    (equal-size) all-gather / reduce-scatter of mappings; the padding rows are never read.
    """

    def __init__(self, group, by_source=False):
        self.group, self.size = group, comm.world(group)
        self.by_source = by_source  # FP8 experts: gather each rank's per-source counts too (gather())

    def gather(self, x, counts):
        """x [N, h] (counts: TokenCounts, rows per local expert) -> ([sum over ranks of N, h] sorted by
        local expert then rank, TokenCounts summed over the ranks, whose by_source names each expert's rows per
        rank and, with by_source where counts knew them, per that rank's sources: ParallelLayout.expert_row_sources'
        order).
        One host read: the ranks' counts."""
        if counts.by_source is None or not self.by_source:
            table = comm.all_gather_dim0(counts.counts().unsqueeze(0), self.group)  # [ETP, local experts]
            host = table.tolist()
            by_source = [[row[e] for row in host] for e in range(len(counts))]
        else:  # [ETP, local experts, sources]: the counts per source, summed for the rows per expert
            mine = torch.tensor(counts.by_source, dtype=torch.int64).to(x.device)
            per_source = comm.all_gather_dim0(mine.unsqueeze(0), self.group)
            table = per_source.sum(2)
            full = per_source.tolist()
            host = [[sum(sources) for sources in row] for row in full]
            by_source = [[k for row in full for k in row[e]] for e in range(len(counts))]
        rows = [sum(r) for r in host]
        self.width, self.rows = max(1, max(rows)), rows[comm.rank(self.group)]  # no empty collective
        padded = F.pad(x, (0, 0, 0, self.width - x.shape[0]))
        gathered = mappings.gather_from_sequence_parallel_region(padded, self.group)  # [ETP x width, h]
        # segment (rank r, expert e) starts at row r x width + (rows of r's experts before e); take the
        # segments in (expert, rank) order, each a run of consecutive rows
        begin = (torch.cumsum(table, 1) - table + self.width * torch.arange(self.size, device=x.device)[:, None]).T
        length = table.T.reshape(-1)
        total = sum(rows)
        offset = torch.repeat_interleave(begin.reshape(-1) - (torch.cumsum(length, 0) - length), length,
                                         output_size=total)
        self.index = offset + torch.arange(total, device=x.device)
        sizes = [sum(column) for column in zip(*host)]
        return gathered[self.index], TokenCounts(torch.cumsum(table.sum(0), 0), sizes, by_source)

    def scatter(self, y):
        """y [sum over ranks of N, h] (gather's order), partial over the expert-TP shards -> [N, h]:
        this rank's rows, summed over the group."""
        full = y.new_zeros((self.size * self.width, y.shape[1])).index_copy(0, self.index, y)
        return mappings.reduce_scatter_to_sequence_parallel_region(full, self.group)[:self.rows]
