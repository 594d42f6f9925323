"""Where an MoE layer's tokens and experts live on this rank: one value, built from the layout and this rank's
groups (expert_placement), in place of a list of groups. Which group plays which part is the layout's rule
(ParallelLayout.token_group, etp, ecp, expert_row_micro_batches); this module only looks the groups up."""
import dataclasses

from ...parallel_layout import ParallelLayout
from .token_share import TokenShare, token_share


@dataclasses.dataclass(frozen=True)
class ExpertPlacement:
    """tp: the dense TP group, over which the tokens are replicated unless the experts are folded (each TP rank
    routing its own tokens). token_group: the ranks routing parts of one micro-batch (the router's statistics
    and drops are reduced over it): CP, folded TP x CP, None for one rank. ep: the EP group (None at EP 1), this
    rank holding expert block ep_rank. expert_tp: the group splitting each expert (TP, folded expert TP; None at
    one rank). expert_cp: the ranks holding the same experts and rows of the same micro-batches (groups.ecp).
    share: this rank's part of the micro-batch (token_share.py). row_micro_batches: each source's micro-batch
    and how many there are (ParallelLayout.expert_row_micro_batches, DP)."""
    tp: object
    folded: bool = False
    token_group: object = None
    ep: object = None
    ep_size: int = 1
    ep_rank: int = 0
    expert_tp: object = None
    expert_tp_size: int = 1
    expert_tp_rank: int = 0
    expert_cp: object = None
    share: TokenShare = TokenShare()
    row_micro_batches: tuple | None = None


def expert_placement(groups) -> ExpertPlacement:
    """The ExpertPlacement of `groups` (process_groups.ProcessGroups, real or ParallelLayout.plan_groups')."""
    layout, rank = groups.layout, groups.rank
    return ExpertPlacement(
        groups.tp, layout.experts_folded, getattr(groups, layout.token_group),
        groups.ep if layout.ep > 1 else None, layout.ep, groups.ep_rank,
        groups.etp if layout.etp > 1 else None, layout.etp, groups.etp_rank, groups.ecp,
        token_share(groups), (tuple(layout.expert_row_micro_batches(rank)), layout.dp))


def one_rank() -> ExpertPlacement:
    """The placement of a layer alone on one process."""
    return expert_placement(ParallelLayout(1).plan_groups())
