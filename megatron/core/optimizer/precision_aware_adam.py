"""AdamW with Megatron-LM's precision-aware optimizer semantics (--use-precision-aware-optimizer): the main
values and the two moments each in their own dtype (--main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype),
the update computed in fp32 (adamw_step.py), one multi-tensor step per DDP bucket and param group that reads
the main gradient where DDP keeps it (fp32, or bf16 with --main-grads-dtype bf16), applies the clip divisor and
writes the model's parameter itself: MegatronOptimizer skips its copy of the gradients to fp32 and its copy
back for these pieces (reads_grad_view, writes_params)."""
import torch

from ..tensor_parallel.param_meta import has_weight_decay, is_embedding_or_output
from .adam import ADAM_STATES
from .adamw_step import fused_step
from .update_rule import UpdateRule, decay_groups


class PrecisionAwareAdamRule(UpdateRule):
    """dtypes: (main params, exp_avg, exp_avg_sq) torch dtypes. buckets: lists of parameters (the DDP buckets,
    in order): a step launches once per bucket and param group."""

    name = "adam"
    state_names = ADAM_STATES
    reads_grad_view = True
    writes_params = True

    def __init__(self, pieces, lr, weight_decay, betas, eps, dtypes, buckets):
        super().__init__(pieces)
        if any(pc.on_host for pc in self.pieces):
            raise ValueError("the precision-aware optimizer keeps its state on the device (no CPU offload)")
        main_dtype, m_dtype, v_dtype = dtypes
        self.betas, self.eps, self.steps = betas, eps, 0
        self.dtypes = dtypes
        for pc in self.pieces:
            if pc.main.dtype != main_dtype:  # e.g. fp16 main values: a copy of the rounded parameter's range
                pc.main = torch.nn.Parameter(pc.param_view.detach().to(main_dtype))
        self.groups = decay_groups(self.pieces, weight_decay, lr, has_weight_decay, is_embedding_or_output)
        self._state = {id(pc): {"exp_avg": torch.zeros(pc.main.shape, dtype=m_dtype, device=pc.main.device),
                                "exp_avg_sq": torch.zeros(pc.main.shape, dtype=v_dtype, device=pc.main.device)}
                       for pc in self.pieces}
        group_of = {id(p): g for g in self.groups for p in g["params"]}
        bucket_of = {id(p): b for b, params in enumerate(buckets) for p in params}
        # launches: (bucket, group) -> pieces, in buffer order
        self._launches = {}
        for pc in self.pieces:
            key = (bucket_of.get(id(pc.param), -1), id(group_of[id(pc.main)]))
            self._launches.setdefault(key, (group_of[id(pc.main)], []))[1].append(pc)
        self.implementation = None  # "csrc" or "torch", once a step ran

    @property
    def param_groups(self):
        return self.groups

    def state(self, piece):
        return self._state[id(piece)]

    def step(self, divisor):
        self.steps += 1
        for group, pcs in self._launches.values():
            params = [None if pc.param_view.data_ptr() == pc.main.data_ptr() else pc.param_view for pc in pcs]
            self.implementation = fused_step(
                [pc.main.detach() for pc in pcs], [pc.grad_view for pc in pcs],
                [self._state[id(pc)]["exp_avg"] for pc in pcs], [self._state[id(pc)]["exp_avg_sq"] for pc in pcs],
                params, group["lr"], self.betas, self.eps, group["weight_decay"], self.steps, divisor)

    def scalar_state(self):
        return {"step": float(self.steps)} if self.pieces else {}

    def load_scalar_state(self, state):
        self.steps = int(state.get("step", 0.0))
