"""ProcessGroups: one rank's process groups, with its layout (parallel_layout.ParallelLayout) and place in it.

Made by ParallelLayout.build_groups() (real groups) or plan_groups() (stand-ins), and passed down:
nothing reads groups from a global. The sizes and ranks are the layout's; the groups are handles.

    tp, cp, dp, pp      the dense grid's groups (cp: None at CP 1)
    mp                  TP x PP, one model replica
    embd                first and last pipeline stage of this (tp, cp, dp) position, for tied embedding
                        gradients (None on a middle stage)
    dp_cp               DP x CP: gradients and loss sums are reduced over it (dp itself at CP 1)
    etp, ep, edp        the experts' TP, EP and expert-DP groups (etp = tp unless folded; ep None at EP 1
                        unless folded; edp = dp_cp at EP 1 unless folded)
    tp_cp               folded experts only: the TP x CP ranks that share each sequence
    ecp                 the ranks holding the same experts whose inputs share micro-batches (FP8 experts reduce
                        each micro-batch's amaxes over it; ParallelLayout.expert_row_sources): cp at EP 1, tp_cp
                        folded at EP 1, None where each rank's experts hold whole micro-batches
    pp_grad             ZB-V only: a second group of the pipeline's ranks, for the gradients
"""
from __future__ import annotations

import dataclasses
import functools


@dataclasses.dataclass(frozen=True)
class ProcessGroups:
    layout: object  # the ParallelLayout the groups were built from
    rank: int
    tp: object = None
    cp: object = None
    dp: object = None
    pp: object = None
    mp: object = None
    embd: object = None
    dp_cp: object = None
    etp: object = None
    ep: object = None
    edp: object = None
    tp_cp: object = None
    pp_grad: object = None
    ecp: object = None

    NAMES = ("tp", "cp", "dp", "pp", "mp", "embd", "dp_cp", "etp", "ep", "edp", "tp_cp", "pp_grad", "ecp")

    @functools.cached_property
    def position(self):
        return self.layout.position(self.rank)

    @property
    def world_size(self) -> int:
        return self.layout.world

    @property
    def tp_size(self) -> int:
        return self.layout.tp

    @property
    def cp_size(self) -> int:
        return self.layout.cp

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def pp_size(self) -> int:
        return self.layout.pp

    @property
    def vpp_size(self):
        return self.layout.virtual_stages

    @property
    def ep_size(self) -> int:
        return self.layout.ep

    @property
    def etp_size(self) -> int:
        return self.layout.etp

    @property
    def edp_size(self) -> int:
        return self.layout.edp

    @property
    def expert_folded(self) -> bool:
        return self.layout.experts_folded

    @property
    def tp_rank(self) -> int:
        return self.position.tp

    @property
    def cp_rank(self) -> int:
        return self.position.cp

    @property
    def dp_rank(self) -> int:
        return self.position.dp

    @property
    def pp_rank(self) -> int:
        return self.position.pp

    @property
    def etp_rank(self) -> int:
        return self.position.etp

    @property
    def ep_rank(self) -> int:
        return self.position.ep

    @property
    def edp_rank(self) -> int:
        return self.position.edp

    @functools.cached_property
    def dp_cp_rank(self) -> int:
        """This rank's index in dp_cp (CP fastest)."""
        return self.layout.group_of("dp_cp", self.rank).index(self.rank)

    @functools.cached_property
    def pp_ranks(self) -> list[int]:
        """The global ranks of this rank's pipeline, by pipeline rank."""
        return self.layout.group_of("pp", self.rank)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.layout.pp - 1

    def describe(self) -> str:
        return self.layout.describe()

    def with_pipeline(self, vpp=None, schedule=None):
        """These groups for another pipeline schedule over the same ranks: the layout with `vpp` chunks per
        rank and `schedule`, the same handles (no group changes; ZB-V needs pp_grad built already)."""
        layout = dataclasses.replace(self.layout, vpp=vpp, schedule=schedule)
        if layout.v_shape and self.pp_grad is None:
            raise ValueError("ZB-V sends its gradients over groups.pp_grad: build the groups with schedule zb_v")
        return dataclasses.replace(self, layout=layout)
