"""Group-limited (device- / node-limited) top-k, as Megatron-Core's --moe-router-num-groups /
--moe-router-group-topk (DeepSeek-V2 / V3): the experts are split into num_groups equal groups in
index order; each token keeps the group_topk groups whose top-(topk // group_topk) scores sum highest,
then takes its top-k experts from those groups only."""
import torch


def group_limited_topk(choice, topk, num_groups, group_topk):
    """choice [T, E] (the scores the choice is made on) -> (values [T, k], indices [T, k]) of the top-k
    over the experts of each token's chosen groups (the others masked to -inf)."""
    tokens, experts = choice.shape
    grouped = choice.view(tokens, num_groups, experts // num_groups)
    group_scores = grouped.topk(topk // group_topk, dim=-1).values.sum(dim=-1)
    kept = torch.zeros_like(group_scores, dtype=torch.bool)
    kept.scatter_(1, torch.topk(group_scores, group_topk, dim=-1).indices, True)
    allowed = kept.unsqueeze(-1).expand_as(grouped).reshape(tokens, experts)
    return torch.topk(choice.masked_fill(~allowed, float("-inf")), topk, dim=-1)


def select(choice, topk, num_groups=None, group_topk=None):
    """(values, indices) of the top-k of choice [T, E]; group-limited when group_topk is set."""
    if group_topk:
        return group_limited_topk(choice, topk, num_groups, group_topk)
    return torch.topk(choice, topk, dim=-1)
