"""--optimizer muon: Muon on the hidden matrices (param_meta.is_muon_matrix), as Megatron-Core's
TensorParallelMuon; the other parameters go to the scalar optimizer (AdamW). docs/muon.md writes it out.

Per matrix W with gradient G (unscaled, clipped by the global norm), momentum M, learning rate lr,
weight decay wd, momentum beta:

    M <- beta M + (1 - beta) G                    (an EMA, as Megatron-Core)
    U  = (1 - beta) G + beta M  with --muon-nesterov, else M
    W <- W - lr wd W - lr s NS(U)                 (decoupled weight decay)

NS (newton_schulz.py) runs on each whole matrix (Q, K and V of a fused QKV weight apart, muon_matrix.py),
s = newton_schulz.scale_factor(rows, cols) x --muon-extra-scale-factor of the whole matrix's sizes.
Momentum lives in the optimizer's pieces (whole TP shards, or DP slices of them: muon_owners.py).
"""
from dataclasses import dataclass

import torch

from ..tensor_parallel.param_meta import has_weight_decay, is_muon_matrix
from .muon_matrix import ns_cost, orthogonalize
from .muon_owners import MatrixOwners
from .newton_schulz import SCALE_MODES, coefficient_schedule
from .update_rule import UpdateRule, decay_groups

TP_MODES = ("duplicated", "distributed", "blockwise")
MATMUL_PRECISIONS = ("low", "medium", "high")


@dataclass(frozen=True)
class MuonConfig:
    """Megatron-LM's --muon-* values. fp32_matmul_prec: low / medium run Newton-Schulz's matmuls in bf16 on
    a GPU (Megatron-Core's BF16 I/O), high in fp32; on a CPU always fp32 (parity tests stay tight)."""
    momentum: float = 0.9
    nesterov: bool = False
    num_ns_steps: int = 5
    coefficient_type: str = "quintic"
    scale_mode: str = "spectral"
    extra_scale_factor: float = 1.0
    split_qkv: bool = True
    tp_mode: str = "duplicated"
    fp32_matmul_prec: str = "medium"

    def __post_init__(self):
        coefficient_schedule(self.coefficient_type, self.num_ns_steps)  # ValueError naming the rule
        if self.scale_mode not in SCALE_MODES:
            raise ValueError(f"unknown Muon scale mode {self.scale_mode!r}: one of {', '.join(SCALE_MODES)}")
        if self.tp_mode not in TP_MODES:
            raise ValueError(f"unknown Muon TP mode {self.tp_mode!r}: one of {', '.join(TP_MODES)}")
        if self.fp32_matmul_prec not in MATMUL_PRECISIONS:
            raise ValueError(f"unknown Muon matmul precision {self.fp32_matmul_prec!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"Muon momentum {self.momentum}: in [0, 1)")

    def ns_dtype(self, device) -> torch.dtype:
        """The dtype of Newton-Schulz's matmuls on `device`."""
        return torch.bfloat16 if device.type == "cuda" and self.fp32_matmul_prec != "high" else torch.float32


class MuonRule(UpdateRule):
    """Muon over `pieces` (all of one optimizer's Muon pieces). sharded: the pieces are DP slices of the
    DDP buckets (the distributed optimizer), orthogonalised by their owners (muon_owners.py); else each
    piece is its parameter's whole TP shard. Collective over TP (the split matrices) and, sharded, DP."""

    name = "muon"
    state_names = ("momentum_buffer",)

    def __init__(self, pieces, groups, ddp, sharded, cfg, lr, weight_decay):
        super().__init__(pieces)
        self.groups, self.cfg = groups, cfg
        self.schedule = coefficient_schedule(cfg.coefficient_type, cfg.num_ns_steps)
        self._groups = decay_groups(self.pieces, weight_decay, lr, has_weight_decay, lambda p: False)
        by_main = {id(pc.main): pc for pc in self.pieces}
        self._group_of = {id(by_main[id(m)]): g for g in self._groups for m in g["params"]}  # its lr and decay
        self._momentum = {id(pc): torch.zeros_like(pc.main) for pc in self.pieces}
        mine = {id(pc.param) for pc in self.pieces}
        self.owners = None
        if sharded:  # every rank builds the same plan (the layout's), whichever pieces it holds
            # the Muon parameters of every rank of the DP group alike: by the rule, not by this rank's pieces
            muon_ids = {id(p) for buf in ddp.buffers for p in buf.params if is_muon_matrix(p)}
            self.owners = MatrixOwners(ddp, lambda p: id(p) in muon_ids, lambda p: ns_cost(p, groups, cfg))
        elif len(mine) != len(self.pieces):
            raise ValueError("Muon without a sharded optimizer takes whole parameters")

    @property
    def param_groups(self):
        return self._groups

    def state(self, piece):
        return {"momentum_buffer": self._momentum[id(piece)]}

    def _directions(self):
        """Each piece's U (momentum, or Nesterov's mix) after the momentum update, one at a time: a mix is a
        temporary of its piece's size only."""
        grads = [pc.main.grad for pc in self.pieces]
        moms = [self._momentum[id(pc)] for pc in self.pieces]
        torch._foreach_lerp_(moms, grads, 1.0 - self.cfg.momentum)
        for g, m in zip(grads, moms):
            yield g.lerp(m, self.cfg.momentum) if self.cfg.nesterov else m

    @torch.no_grad()
    def step(self, divisor):
        if not self.pieces and self.owners is None:
            return
        if divisor is not None and self.pieces:
            torch._foreach_div_([pc.main.grad for pc in self.pieces], divisor)
        for pc, update in self._updates(self._directions()):  # applied as they come: no model-sized temporary
            g = self._group_of[id(pc)]
            main = pc.main.detach()
            if g["weight_decay"] > 0:
                main.mul_(1.0 - g["lr"] * g["weight_decay"])
            main.add_(update, alpha=-g["lr"])

    def _updates(self, dirs):
        """(piece, its flat part of the scaled orthogonalised update) for each piece, from `dirs` (_directions)."""
        dtype = self.cfg.ns_dtype(self.pieces[0].main.device if self.pieces else self.owners.device)
        if self.owners is None:
            for pc, u in zip(self.pieces, dirs):
                yield pc, orthogonalize(u.view(pc.param.shape), pc.param, self.groups, self.cfg, self.schedule,
                                        dtype).reshape(-1)
            return
        whole = self.owners.gather({id(pc.param): u for pc, u in zip(self.pieces, dirs)})
        done = {id(p): orthogonalize(whole.pop(id(p)).view(p.shape), p, self.groups, self.cfg, self.schedule,
                                     dtype).reshape(-1) for p in self.owners.owned_params()}
        mine = self.owners.scatter(done)
        del done
        for pc in self.pieces:
            yield pc, mine[id(pc.param)]
