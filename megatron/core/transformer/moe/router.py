"""Top-k router: scores every token against every expert and picks k experts per token."""
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ... import comm
from ...tensor_parallel import wgrad_fusion
from ...tensor_parallel.param_meta import param_meta, set_init
from . import aux_losses, force_balance
from .capacity import drop_over_capacity
from .group_routing import select
from .token_counts import tokens_per_expert

ROUTER_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def topk_routing(logits, topk, score_function="softmax", pre_softmax=False, expert_bias=None, num_groups=None,
                 group_topk=None, scaling_factor=None):
    """logits [T, E] -> (probs [T, k], indices [T, k], scores [T, E] for the balance loss).

    softmax: top-k of the logits, then softmax over those k (with pre_softmax: softmax over all
    experts, then its top-k, unnormalised). sigmoid: top-k of sigmoid(logits), normalised to sum
    to 1 when k > 1. expert_bias [E] (aux-loss-free balancing) shifts the choice only: the probs
    are the unbiased scores of the chosen experts. num_groups / group_topk: the top-k is group-limited
    (group_routing.py) on the scores the choice is made on. scaling_factor: the probs times it (DeepSeek-V3's
    routed scaling factor, after the sigmoid normalisation).
    """
    wide = torch.promote_types(logits.dtype, torch.float32)  # fp32 statistics; fp64 stays fp64 (--moe-router-dtype)
    if score_function == "softmax":
        full = torch.softmax(logits.to(wide), dim=-1).type_as(logits)
        if pre_softmax or expert_bias is not None:
            choice = full if expert_bias is None else full + expert_bias
            indices = select(choice, topk, num_groups, group_topk).indices
            probs = full.gather(1, indices)
        else:
            top, indices = select(logits, topk, num_groups, group_topk)
            probs = torch.softmax(top.to(wide), dim=-1).type_as(logits)
        return _scaled(probs, scaling_factor), indices, full
    # with sigmoid scores there is no softmax to move: pre_softmax changes nothing (as Megatron-Core)
    scores = torch.sigmoid(logits.to(wide)).type_as(logits)
    choice = scores if expert_bias is None else scores + expert_bias
    indices = select(choice, topk, num_groups, group_topk).indices
    probs = scores.gather(1, indices)
    if topk > 1:
        probs = probs / (probs.sum(-1, keepdim=True) + 1e-20)
    return _scaled(probs, scaling_factor), indices, scores / (scores.sum(-1, keepdim=True) + 1e-20)


def _scaled(probs, factor):
    return probs * factor if factor else probs


class TopKRouter(nn.Module):
    """[T, h] tokens -> (probs [T, k], expert indices [T, k]); replicated on every rank.

    Adds the load-balancing and z losses to the output's backward (aux_losses.attach) and records
    them. The expert bias (a buffer, not trained by the optimizer) moves by update_expert_bias();
    checkpoints hold it through bias_state() (transformer/model_state.py).
    cp_group (context parallelism: each rank holds part of every sequence; with folded experts the
    TP x CP group, each TP rank routing its own share): the losses' counts are summed over it and each
    rank's loss is its part of the micro-batch's (the parts add up over the group).
    """

    def __init__(self, config, layer_number, device=None, cp_group=None):
        super().__init__()
        self.config, self.layer_number, self.cp_group = config, layer_number, cp_group
        self.losses = None  # the RouterLosses the training loop gives (step_hooks.bind); None: nothing recorded
        self.cp_size = comm.world(cp_group) if cp_group is not None else 1
        E = config.num_experts
        self.weight = nn.Parameter(torch.empty(E, config.hidden_size, dtype=config.params_dtype, device=device))
        set_init(self.weight, "normal", config.init_method_std)
        enabled = config.moe_router_enable_expert_bias
        self.register_buffer("expert_bias", torch.zeros(E, device=device) if enabled else None)
        self.register_buffer("bias_tokens", torch.zeros(E, device=device) if enabled else None)
        forced = config.moe_router_force_load_balancing  # the fixed matrix of force_balance.py, not checkpointed
        self.register_buffer("force_projection", force_balance.projection(config.hidden_size, E, layer_number, device)
                             if forced else None, persistent=False)

    def forward(self, x, seq_len, rows=None):
        """x [T, h] with T = seq_len x b (row si*b + bi). -> (probs, indices, aux) where aux is the
        sum of the losses to attach to the layer's output (None when there are none). With a capacity
        factor, dropped pairs have index E and prob 0 (capacity.py); rows [T] (with cp_group): the
        tokens' rows in the micro-batch, whose routing is all-gathered over cp_group for the drops."""
        c = self.config
        dtype = ROUTER_DTYPES.get(c.moe_router_dtype)  # --moe-router-dtype: the whole routing in that dtype
        if dtype is None or dtype == self.weight.dtype:
            logits = wgrad_fusion.linear_or_fused(x if dtype is None else x.to(dtype), self.weight)
        else:  # the cast weight's gradient reaches .grad through autograd, which DDP takes as any other
            logits = F.linear(x.to(dtype), self.weight.to(dtype))
        forced = self.force_projection
        routed = logits if forced is None else force_balance.random_logits(logits, x, forced)
        probs, indices, scores = topk_routing(routed, c.moe_router_topk, c.moe_router_score_function,
                                              c.moe_router_pre_softmax, self.expert_bias, c.moe_router_num_groups,
                                              c.moe_router_group_topk, c.moe_router_topk_scaling_factor)
        chosen = indices  # the balance losses and counts see the choice before any drop
        counts = tokens_per_expert(chosen, c.num_experts).float()  # exact below 2^24 pairs
        if c.moe_expert_capacity_factor is not None:
            probs, indices = drop_over_capacity(probs, indices, c.num_experts, c.moe_expert_capacity_factor,
                                                c.moe_token_drop_policy, self.cp_group if rows is not None else None,
                                                rows)
        losses = []
        if torch.is_grad_enabled():  # training (recompute: only the pass that builds the graph)
            if self.losses is not None:
                self.losses.record_tokens(self.layer_number, counts)
            if self.expert_bias is not None:
                self.bias_tokens += counts
            for kind, coeff, name in c.balance_losses():  # several types add up, each with its coefficient
                if kind == "aux_loss":
                    whole = counts.to(scores.dtype)
                    if self.cp_size > 1:
                        dist.all_reduce(whole, group=self.cp_group)
                    loss = aux_losses.switch_load_balancing_loss(scores, whole, c.moe_router_topk, coeff,
                                                                 x.shape[0] * self.cp_size)
                else:
                    loss = aux_losses.sequence_load_balancing_loss(scores, chosen, seq_len, c.moe_router_topk,
                                                                   coeff, self.cp_group)
                self._record(name, loss)
                losses.append(loss)
            if c.moe_z_loss_coeff:
                loss = aux_losses.z_loss(logits, c.moe_z_loss_coeff, self.cp_size)
                self._record("z_loss", loss)
                losses.append(loss)
        return probs, indices, (functools.reduce(torch.add, losses) if losses else None)

    def _record(self, name, loss):
        if self.losses is not None:
            self.losses.record(name, loss)

    @property
    def backward_scale(self) -> float:
        """The router losses' gradient (RouterLosses.scale; 1 when no training loop gave one)."""
        return self.losses.scale if self.losses is not None else 1.0

    def bias_state(self):
        """[(layout-free key, expert_bias [E] fp32)], or [] without the bias. The key is the router
        weight's init_key with `expert_bias` for `weight` (layers numbered over the whole model); the
        value is the same on every rank holding this layer (TP, DP, CP and EP ranks)."""
        if self.expert_bias is None:
            return []
        return [(param_meta(self.weight).init_key.removesuffix("weight") + "expert_bias", self.expert_bias)]

    @torch.no_grad()
    def update_expert_bias(self, groups):
        """After an iteration: bias_e += rate x sign(mean - tokens_e), tokens summed over
        aux_losses.token_groups (groups.dp_cp: every TP and pipeline rank of a layer holds the same counts,
        CP ranks hold parts; folded experts: TP ranks hold parts too). Clears the counts."""
        if self.expert_bias is None:
            return
        for group, size in aux_losses.token_groups(groups):
            if size > 1:
                dist.all_reduce(self.bias_tokens, group=group)
        offset = self.bias_tokens.mean() - self.bias_tokens
        self.expert_bias += self.config.moe_router_bias_update_rate * torch.sign(offset)
        self.bias_tokens.zero_()
