"""Router losses (load balancing, z-loss), how their gradient enters backward, and their report.

The losses are formed inside each MoE layer, on every pipeline stage, so they cannot ride the
last stage's loss terms (pipeline_parallel/losses.py) for backward. As Megatron-Core does,
each is attached to the layer's output by an autograd function that is the identity forward
and, backward, gives the loss the gradient `backward_scale` (the iteration's loss scale over
the number of microbatches in the global batch, RouterLosses.start_iteration). The values are
recorded, detached, in the RouterLosses the training loop gives the model's MoE layers
(step_hooks.bind) and reported after the iteration as named terms in the ReducedLosses form
({name: (sum, count)}), so the log and the metrics file treat them like "lm loss".
"""
import dataclasses

import torch
import torch.distributed as dist


@dataclasses.dataclass
class RouterLosses:
    """What the MoE layers of one model record, shared by them: the router losses' backward scale, each
    loss's sum over this iteration's micro-batches and layers, and the tokens per expert of each layer
    over the log interval. Made and passed by the training loop (step_hooks); no module holds one."""
    scale: float = 1.0
    sums: dict = dataclasses.field(default_factory=dict)
    tokens: dict = dataclasses.field(default_factory=dict)

    def start_iteration(self, loss_scale, microbatches_in_global_batch):
        """Before forward_backward: the router losses' gradient scale; clears the loss sums."""
        self.scale = float(loss_scale) / microbatches_in_global_batch
        self.sums = {}

    def record(self, name, value):
        """Add one micro-batch's loss value of one layer (detached) to this iteration's sums."""
        self.sums[name] = self.sums.get(name, 0.0) + value.detach().float()

    def record_tokens(self, layer_number, tokens_per_expert):
        """Add a micro-batch's tokens per expert [E] of one layer to the counts of the log interval."""
        self.tokens[layer_number] = self.tokens.get(layer_number, 0) + tokens_per_expert.detach().float()


def switch_load_balancing_loss(scores, tokens_per_expert, topk, coeff, total_tokens=None):
    """Switch / GShard loss over one micro-batch: coeff x E / (k T^2) x sum_e (sum_t p_te) n_e.

    scores [T_local, E]: softmax (or normalised sigmoid) over all experts of this rank's tokens;
    tokens_per_expert [E]: the (token, choice) pairs routed to each expert over the whole micro-batch;
    total_tokens: T, the micro-batch's tokens (default T_local). With context parallelism (T = CP x
    T_local, counts summed over CP) this is this rank's part: the parts sum over CP to the loss, and
    each part's gradient is the loss's for this rank's tokens. -> scalar. No communication.
    """
    T, E = scores.shape
    T = total_tokens or T
    return coeff * E / (topk * T * T) * (scores.sum(0) * tokens_per_expert).sum()


def sequence_load_balancing_loss(scores, indices, seq_len, topk, coeff, cp_group=None):
    """Per-sequence balance (DeepSeek-V2): coeff x mean_b sum_e f_be P_be with f_be = n_be E / (k s)
    and P_be = mean over the sequence of p_te. scores [s*b, E] (row si*b + bi), indices [s*b, k].

    cp_group (context parallelism: this rank holds s = seq_len of the C x seq_len tokens of each
    sequence): n_be is all-reduced over it and the result is this rank's part (sum over CP = loss)."""
    T, E = scores.shape
    b = T // seq_len
    # [b, E]; one_hot reads the ids' range on the host (CPU) and makes an int64 [T, k, E]
    counts = (indices.view(seq_len, b, topk, 1) == torch.arange(E, device=indices.device)).sum((0, 2))
    counts = counts.to(scores.dtype)
    parts = 1 if cp_group is None else dist.get_world_size(cp_group)
    if parts > 1:
        dist.all_reduce(counts, group=cp_group)
    f = counts * E / (topk * seq_len * parts)
    P = scores.view(seq_len, b, E).sum(0) / (seq_len * parts)
    return coeff * (f * P).sum(1).mean()


def z_loss(logits, coeff, parts=1):
    """ST-MoE router z-loss: coeff x mean_t logsumexp(logits_t)^2. logits [T, E] -> scalar; with
    context parallelism (parts = CP ranks, each holding T of the tokens) this rank's part of the mean."""
    loss = coeff * torch.logsumexp(logits, dim=-1).square().mean()
    return loss / parts if parts > 1 else loss


class _AttachLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, loss, scale):
        ctx.shape, ctx.dtype, ctx.scale = loss.shape, loss.dtype, scale
        return out

    @staticmethod
    def backward(ctx, g):
        return g, torch.full(ctx.shape, ctx.scale, dtype=ctx.dtype, device=g.device), None


def attach(out, loss, scale):
    """out, with `loss`'s gradient (`scale`, RouterLosses.scale) joining backward through it."""
    return _AttachLoss.apply(out, loss, scale)


def token_groups(groups):
    """[(group, size)] over which the ranks of a pipeline stage route different tokens (ParallelLayout.
    routing_groups)."""
    return [(getattr(groups, name), groups.layout.group_size(name)) for name in groups.layout.routing_groups]


def iteration_report(names, groups, microbatches_in_global_batch, moe_layers, device, losses=None):
    """{name: (sum, count)} of each router loss over the global batch: summed over this rank's
    micro-batches and layers (`losses`, this rank's RouterLosses; None on a stage without MoE layers),
    all-reduced over token_groups (the CP, and folded the TP, ranks' parts add up to the loss) and
    groups.pp; count = micro-batches x MoE layers, so the mean is per layer and micro-batch. Every rank
    calls it (collective)."""
    if not names:
        return {}
    zero = torch.zeros((), device=device)  # a stage without MoE layers records nothing
    sums = losses.sums if losses is not None else {}
    sums = torch.stack([sums.get(n, zero) for n in names])
    for group, size in token_groups(groups) + [(groups.pp, groups.pp_size)]:
        if size > 1:
            dist.all_reduce(sums, group=group)
    count = torch.full((), float(microbatches_in_global_batch * moe_layers), device=device)  # no host copy
    return {n: (sums[i], count) for i, n in enumerate(names)}


def tokens_balance(groups, num_layers, num_experts, device, losses=None):
    """(min, max) over MoE layers and experts of the tokens routed since the last call (`losses`, this
    rank's RouterLosses), summed over token_groups and groups.pp (collective); clears the counts. None
    when nothing was routed. One host read (at log intervals only: the counts are summed on the device
    every micro-batch)."""
    table = torch.zeros(num_layers, num_experts, device=device)
    if losses is not None:
        for layer, counts in losses.tokens.items():
            table[layer - 1] += counts.to(device)
        losses.tokens = {}
    for group, size in token_groups(groups) + [(groups.pp, groups.pp_size)]:
        if size > 1:
            dist.all_reduce(table, group=group)
    used = (table.sum(1) > 0)[:, None]
    low = torch.where(used, table, torch.inf).min()
    high = torch.where(used, table, -torch.inf).max()
    low, high, any_used = torch.stack([low, high, used.any().float()]).tolist()
    return (low, high) if any_used else None
