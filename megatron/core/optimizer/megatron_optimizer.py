"""AdamW on fp32 main parameters, for any model dtype, plain or sharded over DP.

The optimizer works on "pieces": for the plain optimizer, each parameter whole; for the
distributed optimizer, the part of each parameter inside this DP rank's shard of its
bucket (see param_and_grad_buffer). Each piece has an fp32 main copy (an alias of the
parameter's own storage when the model is fp32, so no second copy exists) whose .grad
is the matching view of the DDP gradient buffer. After the step, bf16/fp16 pieces are
copied back into the parameters and, when sharded, each bucket is all-gathered over DP.
"""
import torch
import torch.distributed as dist

from .clip_grads import clip_by_norm_, counted_once, global_norm


class _Piece:
    def __init__(self, param, lo, hi, main, grad_view):
        self.param, self.lo, self.hi = param, lo, hi
        self.main, self.grad_view = main, grad_view


class MegatronOptimizer:
    """Mixed-precision (optionally distributed) AdamW over the buffers of `ddp`.

    groups: the rank grid; the grad norm is summed over groups.mp (and groups.dp when
    sharded); overflow checks (fp16) over the whole world.
    grad_scaler: None (bf16/fp32) or a Constant/DynamicGradScaler (fp16).
    """

    def __init__(self, ddp, groups, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8,
                 clip_grad=1.0, grad_scaler=None):
        self.ddp, self.groups = ddp, groups
        self.clip_grad, self.grad_scaler = clip_grad, grad_scaler
        self.sharded = ddp.use_distributed_optimizer
        self.pieces = []
        for buf in ddp.buffers:
            for bucket in buf.buckets:
                lo_b, hi_b = bucket.shard() if self.sharded else (bucket.start, bucket.end)
                for p in bucket.params:
                    off = buf.offset(p)
                    lo, hi = max(off, lo_b), min(off + p.numel(), hi_b)
                    if lo < hi:
                        self.pieces.append(self._make_piece(p, lo - off, hi - off))
        decay = [pc.main for pc in self.pieces if pc.param.ndim > 1]
        no_decay = [pc.main for pc in self.pieces if pc.param.ndim <= 1]
        device = ddp.buffers[0].grad_data.device
        self.device = device
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr, betas=betas, eps=eps, fused=True)
        for pc in self.pieces:  # allocate the Adam state now: memory is accounted at start-up
            self.optimizer.state[pc.main] = {
                "step": torch.zeros((), dtype=torch.float32, device=device),
                "exp_avg": torch.zeros_like(pc.main), "exp_avg_sq": torch.zeros_like(pc.main)}
        self._counted = [counted_once(pc.param, groups.tp_rank, groups.pp_rank) for pc in self.pieces]

    @staticmethod
    def _make_piece(param, lo, hi):
        flat = param.detach().view(-1)[lo:hi]
        if param.dtype == torch.float32:
            main = torch.nn.Parameter(flat)  # shares the parameter's storage
        else:
            main = torch.nn.Parameter(flat.float())
        grad_view = param.main_grad.view(-1)[lo:hi]
        if grad_view.dtype == torch.float32:
            main.grad = grad_view
        else:
            main.grad = torch.zeros_like(main)
        return _Piece(param, lo, hi, main, grad_view)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def loss_scale(self):
        return self.grad_scaler.scale if self.grad_scaler is not None else 1.0

    def _norm_groups(self):
        return [self.groups.mp] + ([self.groups.dp] if self.sharded else [])

    def step(self):
        """Unscale and check (fp16), clip by the global norm, update, copy back, gather.

        Returns (updated, grad_norm): updated is False when fp16 grads overflowed (the
        step is skipped and the scale backs off); grad_norm is a tensor or None.
        """
        for pc in self.pieces:
            if pc.grad_view.dtype != torch.float32:
                pc.main.grad.copy_(pc.grad_view)
        grads = [pc.main.grad for pc in self.pieces]
        if self.grad_scaler is not None:
            found_inf = torch.zeros(1, device=self.device)
            if grads:
                torch._amp_foreach_non_finite_check_and_unscale_(
                    grads, found_inf, torch.full((1,), 1.0 / self.grad_scaler.scale, device=self.device))
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)  # any rank, any stage or shard
            overflow = bool(found_inf.item())
            self.grad_scaler.update(overflow)
            if overflow:
                return False, None
        norm = global_norm([g for g, c in zip(grads, self._counted) if c], self._norm_groups(), self.device)
        clip_by_norm_(grads, self.clip_grad, norm)
        self.optimizer.step()
        for pc in self.pieces:
            if pc.param.dtype != torch.float32:
                pc.param.detach().view(-1)[pc.lo:pc.hi].copy_(pc.main.detach())
        if self.sharded:
            self.ddp.start_param_sync()
        return True, norm

    def memory_bytes(self):
        """Bytes of optimizer state on this rank: fp32 main copies (when not aliases) + Adam moments."""
        total = 0
        for pc in self.pieces:
            if pc.param.dtype != torch.float32:
                total += pc.main.numel() * 4
            state = self.optimizer.state[pc.main]
            total += sum(state[k].numel() * state[k].element_size() for k in ("exp_avg", "exp_avg_sq"))
        return total
