"""An optimizer (AdamW, SGD or Muon + AdamW) on fp32 main parameters, for any model dtype, and the
state API checkpoints use.

The optimizer works on "pieces": here each parameter whole; in the distributed optimizer
(distributed_optimizer.py) the part of each parameter inside this DP rank's shard of its
bucket. Each piece has an fp32 main copy (an alias of the parameter's own storage when
the model is fp32, so no second copy exists) whose .grad is the matching view of the DDP
gradient buffer. After the step, bf16/fp16 pieces are copied back into the parameters.
What moves the main values is an update rule per piece (update_rule.py; update_rules.build
picks them for --optimizer): loss scaling, the grad norm, clipping, the copy back and the
gather are the same for every optimizer.

Outside this package, optimizer state is seen only as StatePieces (state_pieces /
load_state_pieces) and scalar_state / load_scalar_state: no one reads an optimizer's internals.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..tensor_parallel.param_meta import counted_once, is_expert_parallel
from ..timers import phase
from . import update_rules
from .adam import ADAM_STATES
from .clip_grads import clip_by_norm_, clip_divisor, model_sum, squares, zeros
from .cpu_offload import host_copy, offloaded
from .nvme_offload import FileAdamRule

STATE_NAMES = ("param",) + ADAM_STATES  # Adam's pieces; the state names of any piece: state_names(param)


@dataclass
class StatePiece:
    """Optimizer state of the flat range [start, end) of one parameter's local (TP) shard.

    tensors: state name -> 1-D fp32 tensor of end - start values; "param" is the fp32
    main value, then the piece's optimizer state (Adam's "exp_avg" / "exp_avg_sq", Muon's and
    SGD's "momentum_buffer"). From state_pieces() these are the live tensors: read them, and
    write through load_state_pieces.
    """

    param: torch.nn.Parameter
    start: int
    end: int
    tensors: dict[str, torch.Tensor]


def _copy_all(pairs):
    """dst.copy_(src) for each (dst, src): one multi-tensor copy per (dst device, src device)."""
    by_devices = {}
    for dst, src in pairs:
        by_devices.setdefault((dst.device, src.device), []).append((dst, src))
    for group in by_devices.values():
        torch._foreach_copy_([d for d, _ in group], [s for _, s in group])


class _Piece:
    def __init__(self, param, lo, hi, main, grad_view, param_view):
        self.param, self.lo, self.hi = param, lo, hi
        self.main, self.grad_view, self.param_view = main, grad_view, param_view
        self.rule = None  # the update rule that moves it (update_rules.build)
        self.on_host = False

    def state(self):
        return self.rule.state(self)


class MegatronOptimizer:
    """A mixed-precision optimizer over the buffers of `ddp` (each DP rank updates every parameter).

    groups: the rank grid; the grad norm is summed over groups.mp; overflow checks (fp16)
    over the whole world. grad_scaler: None (bf16/fp32) or a Constant/DynamicGradScaler (fp16).
    cpu_offload_fraction: the share of this rank's optimizer state kept and updated on the host
    (cpu_offload.py); 0 keeps it all on the device. optimizer: "adam" (AdamW), "sgd" or "muon"
    (update_rules.build); sgd_momentum; muon: a muon.MuonConfig (None: Megatron-LM's defaults).
    file_offload: a nvme_offload.FileOffload: the host pieces' state lives in its file instead (Adam only).
    """

    distributed_optimizer = False

    def __init__(self, ddp, groups, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8,
                 clip_grad=1.0, grad_scaler=None, cpu_offload_fraction=0.0, optimizer="adam", sgd_momentum=0.9,
                 muon=None, file_offload=None):
        if ddp.config.shards_optimizer != self.distributed_optimizer:
            raise ValueError(f"{type(self).__name__} does not match a DDP built with sharding strategy "
                             f"{ddp.config.data_parallel_sharding_strategy}: build it with get_megatron_optimizer")
        self.ddp, self.groups = ddp, groups
        self.clip_grad, self.grad_scaler = clip_grad, grad_scaler
        ranges = self._ranges()
        host = offloaded([hi - lo for _, lo, hi in ranges], cpu_offload_fraction)
        self._pieces = [self._make_piece(p, lo, hi, on_host, file_offload)
                        for (p, lo, hi), on_host in zip(ranges, host)]
        self._index = {(id(pc.param), pc.lo, pc.hi): pc for pc in self._pieces}
        self._by_param = {id(pc.param): pc for pc in self._pieces}
        device = ddp.buffers[0].params[0].device
        self.device = device
        self.name = optimizer
        in_file = [pc for pc in self._pieces if pc.main is None]  # --optimizer-offload-path (nvme_offload.py)
        self.rules = update_rules.build(optimizer, [pc for pc in self._pieces if pc.main is not None], groups, ddp,
                                        self.distributed_optimizer, lr, weight_decay, betas, eps, sgd_momentum, muon)
        if in_file:
            self.rules.append(FileAdamRule(in_file, file_offload, lr, weight_decay, betas, eps, device))
        for rule in self.rules:
            for pc in rule.pieces:
                pc.rule = rule
        self._counted = [counted_once(pc.param, groups) for pc in self._pieces]
        # MoE with EP and replicated optimizer state: experts live on other EP ranks, summed over groups.ep
        self._expert = [is_expert_parallel(pc.param) for pc in self._pieces] \
            if groups.layout.expert_dp_apart and not self.distributed_optimizer else None

    def _ranges(self):
        """(param, lo, hi) flat ranges this rank updates, in buffer order: every parameter whole."""
        return [(p, 0, p.numel()) for buf in self.ddp.buffers for bucket in buf.buckets for p in bucket.params
                if p.numel()]

    def _norm_groups(self):
        return [self.groups.mp]

    def _after_update(self):
        """Called once the parameters hold their new values (the distributed optimizer gathers)."""

    def _make_piece(self, param, lo, hi, on_host=False, file_offload=None):
        # where the range persists (ddp.param_view, ddp.grad_view): the parameter and main_grad, or
        # the DP shards of the parameters (ZeRO-3) and of the reduced gradients (ZeRO-2 and 3)
        flat = self.ddp.param_view(param, lo, hi)
        grad_view = self.ddp.grad_view(param, lo, hi)
        if not on_host:
            return self._device_piece(param, lo, hi, flat, grad_view)
        if file_offload is not None:  # no main copy in memory: the state is in the file (FileAdamRule)
            pc = _Piece(param, lo, hi, None, grad_view, flat)
            pc.on_host = True
            return pc
        # separate host copies, even of fp32 on a CPU machine: the copies are explicit
        main = torch.nn.Parameter(host_copy(flat.detach()))
        main.grad = torch.zeros_like(main)
        pc = _Piece(param, lo, hi, main, grad_view, flat)
        pc.on_host = True
        return pc

    @staticmethod
    def _device_piece(param, lo, hi, flat, grad_view):
        if param.dtype == torch.float32:
            main = torch.nn.Parameter(flat)  # shares the parameter's storage
        else:
            main = torch.nn.Parameter(flat.float())
        if grad_view.dtype == torch.float32:
            main.grad = grad_view
        else:
            main.grad = torch.zeros_like(main)
        return _Piece(param, lo, hi, main, grad_view, flat)

    @property
    def param_groups(self):
        """Every rule's param groups (the LR schedule sets their "lr")."""
        return [g for rule in self.rules for g in rule.param_groups]

    def state_names(self, param) -> tuple[str, ...]:
        """The optimizer state a piece of `param` has besides "param" (Adam's moments, a momentum buffer)."""
        pc = self._by_param.get(id(param))
        return pc.rule.state_names if pc is not None else ()

    @property
    def loss_scale(self):
        return self.grad_scaler.scale if self.grad_scaler is not None else 1.0

    def step(self, timers=None):
        """Unscale and check (fp16), clip by the global norm, update, copy back, gather. timers: the
        run's core.timers.Timers (level 1 times each part under Megatron-LM's names), or None.

        Returns (updated, grad_norm): updated is False when fp16 grads overflowed (the
        step is skipped and the scale backs off); grad_norm is a tensor or None.
        """
        with phase(timers, "optimizer-copy-to-main-grad", 1):
            _copy_all([(pc.main.grad, pc.grad_view) for pc in self._pieces
                       if pc.grad_view.dtype != torch.float32 and not pc.on_host])
        grads = self._grads()
        if self.grad_scaler is not None:
            with phase(timers, "optimizer-unscale-and-check-inf", 1):
                found_inf = torch.zeros(1, device=self.device)
                if grads:
                    torch._amp_foreach_non_finite_check_and_unscale_(
                        grads, found_inf, torch.full((1,), 1.0 / self.grad_scaler.scale, device=self.device))
                dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)  # any rank, any stage or shard
                overflow = bool(found_inf.item())
            self.grad_scaler.update(overflow)
            if overflow:
                return False, None
        with phase(timers, "optimizer-clip-main-grad", 1):
            norm = self._model_total(squares, grads).sqrt()
            # the device pieces are divided by the clip divisor inside their rule's step (fused into AdamW's)
            clip_by_norm_([pc.grad_view for pc in self._pieces if pc.on_host], self.clip_grad, norm)
            divisor = clip_divisor(self.clip_grad, norm)
        with phase(timers, "optimizer-inner-step", 1):
            for pc in self._pieces:
                if pc.on_host and pc.main is not None:
                    pc.main.grad.copy_(pc.grad_view)
            for rule in self.rules:
                rule.step(divisor)
        with phase(timers, "optimizer-copy-main-to-model-params", 1):
            # the new values into the model's parameters: one multi-tensor copy (per device)
            _copy_all([(pc.param_view, pc.main.detach()) for pc in self._pieces
                       if (pc.param.dtype != torch.float32 or pc.on_host) and pc.main is not None])
        with phase(timers, "params-all-gather", 1):
            self._after_update()
        return True, norm

    def _grads(self):
        """Each piece's fp32 gradient (offloaded pieces: the device's, checked and clipped there)."""
        return [pc.grad_view if pc.on_host else pc.main.grad for pc in self._pieces]

    def _model_total(self, local_total, tensors):
        """local_total(tensors, device) -> 0-d tensor, over one tensor per piece, summed over the
        whole model with each element once: the grad norm's reduction (pieces counted once, over the
        groups that hold the others)."""
        counted = [t for t, c in zip(tensors, self._counted) if c]
        if self._expert is None:
            return model_sum(local_total(counted, self.device), None, self.groups, self._norm_groups())
        expert = [e for e, c in zip(self._expert, self._counted) if c]
        return model_sum(local_total([t for t, e in zip(counted, expert) if not e], self.device),
                         local_total([t for t, e in zip(counted, expert) if e], self.device), self.groups,
                         [self.groups.mp])

    def count_zeros(self):
        """Zeros in this step's gradients (fp32, unscaled; clipping scales them by a positive number) over
        the whole model, each element once whatever the layout (--log-num-zeros-in-grad): an int64
        tensor. Collective."""
        return self._model_total(zeros, self._grads())

    def params_norm(self):
        """L2 norm of the fp32 main parameters over the whole model, each element once whatever the
        layout (--log-params-norm): an fp32 tensor. Collective."""
        mains = [(pc.main.detach() if pc.main is not None else pc.state()["param"]).to(self.device)
                 for pc in self._pieces]
        return self._model_total(squares, mains).sqrt()

    # ---- state API (checkpoints)
    def state_pieces(self) -> list[StatePiece]:
        """This rank's optimizer state, one StatePiece per (parameter, flat range) it updates."""
        return [StatePiece(pc.param, pc.lo, pc.hi, {**({"param": pc.main.detach()} if pc.main is not None else {}),
                                                    **pc.state()}) for pc in self._pieces]

    @torch.no_grad()
    def load_state_pieces(self, pieces):
        """Copy each piece's tensors into this rank's matching piece (same parameter and range).

        A piece may carry a subset of "param" and state_names(param) (e.g. "param" only, without the state).
        Writing "param" of an fp32 model writes the parameter (the main value is its storage).
        """
        for sp in pieces:
            pc = self._index.get((id(sp.param), sp.start, sp.end))
            if pc is None:
                raise ValueError(f"no optimizer piece for range [{sp.start}, {sp.end}) of a {list(sp.param.shape)} "
                                 "parameter on this rank")
            for name, value in sp.tensors.items():
                if pc.main is None:  # in the file (nvme_offload.py)
                    pc.rule.write(pc, name, value.reshape(-1))
                    continue
                target = pc.main if name == "param" else pc.state()[name]
                target.copy_(value.reshape(-1))

    def scalar_state(self) -> dict:
        """{"optimizer": its name, "step": Adam's step count (float; 0 without Adam pieces), "grad_scaler":
        the loss scaler's state or None}."""
        out = {"optimizer": self.name, "step": 0.0}
        for rule in self.rules:
            out.update(rule.scalar_state())
        return dict(out, grad_scaler=self.grad_scaler.state_dict() if self.grad_scaler is not None else None)

    def load_scalar_state(self, state):
        for rule in self.rules:
            rule.load_scalar_state(state)
        if state.get("grad_scaler") and self.grad_scaler is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])

    def memory_bytes(self, on_host=False):
        """Bytes of optimizer state on this rank's device (on_host: on the host, cpu_offload.py):
        fp32 main copies (when not aliases) + each rule's state (Adam's two moments, a momentum buffer)."""
        mains = sum(pc.main.numel() * 4 for pc in self._pieces if pc.main is not None
                    and pc.on_host == on_host and (pc.param.dtype != torch.float32 or pc.on_host))
        return mains + sum(rule.memory_bytes(on_host) for rule in self.rules)

    def file_bytes(self):
        """Bytes of optimizer state in --optimizer-offload-path's file, and of the buffer it streams through."""
        return [sum(getattr(rule, key, 0) for rule in self.rules) for key in ("file_bytes", "high_water")]
