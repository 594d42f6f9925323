"""The MoE layer: router, token dispatch over the expert-parallel group, local experts, shared experts."""
import dataclasses

from torch import nn

from ... import comm
from ...fp8.config import fp8_layer
from ...tensor_parallel import mappings
from ...tensor_parallel.param_meta import set_sequence_parallel
from ..mlp import MLP
from . import aux_losses
from .capacity import pad_to_capacity, padded_places, places_by_micro_batch, unpad
from .experts import LocalExperts
from .folding import ExpertTPGather, all_tokens, own_tokens
from .router import TopKRouter
from .shared_experts import SharedExpertMLP
from .token_counts import TokenCounts
from .token_dispatcher import build_dispatcher
from .token_share import TokenShare, token_share


class MoELayer(nn.Module):
    """[s(/TP with SP), b, h] -> same, in place of the dense MLP of layer `layer_number`.

    Tokens are replicated over TP (gathered first with sequence parallelism); the experts are
    split over TP like the dense MLP, so their outputs are summed over `tp_group` before combine.
    Experts are split over `ep_group` (None: all here) in blocks of E / EP, this rank
    holding block `ep_rank`. The router's losses join backward through the output; with context
    parallelism its statistics are reduced over `cp_group` (router.py).
    Folded (an `etp_group` given: the layout's expert TP differs from TP, parallel_layout.py): each TP
    rank routes its own tokens (folding.py), `cp_group` is then the TP x CP group, the experts are split
    over `etp_group` and the groups are the folded expert grid's.
    share: this rank's part of the micro-batch (token_share.py; default: all of it, EP micro-batches
    reaching the experts), for the capacity rule and the padded expert input.
    fp8: FP8 settings (core/fp8/config.py) or None. Each expert's input holds this micro-batch's tokens
    routed to it, replicated over TP and split over CP: its amaxes are reduced over both, the TP-split
    weights' and hidden activations' over TP. Under EP or folding it holds rows from several source ranks
    (`row_micro_batches`: (each source's micro-batch, how many there are), ParallelLayout.
    expert_row_micro_batches); each micro-batch's rows are cast together, apart from the others' (experts.py),
    their amaxes reduced over expert TP (the same rows on every expert-TP rank, gathered when folded) and over
    `expert_cp` (groups.ecp: the ranks holding the same experts and rows of the same micro-batches; default
    cp_group, right at EP 1 unfolded). Padded to capacity, such an input is padded per
    micro-batch (capacity.places_by_micro_batch), each one process's padded input.
    """

    def __init__(self, config, tp_group, layer_number, ep_group=None, ep_rank=0, device=None, cp_group=None,
                 etp_group=None, share=None, fp8=None, expert_cp=None, row_micro_batches=None):
        super().__init__()
        self.config, self.tp_group = config, tp_group
        self.tp_size = comm.world(tp_group)
        self.folded = etp_group is not None
        self.etp = ExpertTPGather(etp_group, fp8 is not None) if self.folded and comm.world(etp_group) > 1 else None
        # not folded, the experts are split over TP like the dense MLP (TP 1: no TP collective around them)
        self.expert_tp = tp_group if not self.folded and self.tp_size > 1 else None
        ep = comm.world(ep_group) if ep_group is not None else 1
        count = config.num_experts // ep
        self.ep, self.share = ep, share or TokenShare(sources=ep)
        self.dropless = config.moe_expert_capacity_factor is None
        self.router = TopKRouter(config, layer_number, device, cp_group)
        expert_tp_size = comm.world(etp_group) if self.folded else self.tp_size if self.expert_tp else 1
        expert_tp_group = etp_group if self.folded else self.expert_tp
        expert_cp = cp_group if ep == 1 and not self.folded else expert_cp
        split_over = expert_tp_group if expert_tp_size > 1 else None  # the experts' TP (or expert-TP) shards
        expert_fp8 = None if fp8 is None else (fp8, (split_over, expert_cp), (split_over,))
        self.experts = LocalExperts(config, ep_rank * count, count, expert_tp_size, device,
                                    first_tp_rank=expert_tp_size == 1 or comm.rank(expert_tp_group) == 0,
                                    fp8=expert_fp8, row_micro_batches=row_micro_batches)
        if self.folded:  # each TP rank routes other tokens: the router's gradient is summed over TP
            set_sequence_parallel(self.router.weight)
        self.dispatcher = build_dispatcher(config.moe_token_dispatcher_type, config.num_experts, ep_rank * count,
                                           count, ep_group, by_source=fp8 is not None)
        self.shared_experts = None
        if config.moe_shared_expert_intermediate_size:
            shared = dataclasses.replace(config, ffn_hidden_size=config.moe_shared_expert_intermediate_size)
            self.shared_experts = SharedExpertMLP(shared, tp_group, device, fp8, cp_group)

    def forward(self, hidden):
        sp = self.config.sequence_parallel and self.tp_size > 1
        if self.folded:
            return self._folded_forward(hidden, sp)
        # the router is replicated: its input gradient is whole on every rank (split, not summed)
        x = mappings.gather_from_sequence_parallel_region(hidden, self.tp_group, False) if sp else hidden
        s, b, h = x.shape
        tokens = x.reshape(s * b, h)
        probs, indices, aux = self._route(tokens, s, b)
        etp = self.expert_tp
        expert_in = mappings.copy_to_tensor_model_parallel_region(tokens, etp) if etp is not None else tokens
        routed, counts = self.dispatcher.dispatch(expert_in, probs, indices, self.dropless)
        expert_out = self._experts(routed, counts, s * b)
        if etp is not None:  # summed over TP before the probs weigh them: the router's gradient needs whole outputs
            expert_out = mappings.reduce_from_tensor_model_parallel_region(expert_out, etp)
        out = self.dispatcher.combine(expert_out).view(s, b, h)
        if sp:
            out = mappings.scatter_to_sequence_parallel_region(out, self.tp_group)
        return self._finish(out, hidden, aux)

    def _route(self, tokens, s, b):
        """The router on [s x b, h]; with a capacity factor it is told its rows' places in the micro-batch."""
        rows = None
        if self.config.moe_expert_capacity_factor is not None and self.share.parts > 1:
            rows = self.share.rows(s, b, tokens.device)
        return self.router(tokens, s, rows)

    def _experts(self, routed, counts, local_tokens):
        """The local experts on their rows (counts: TokenCounts), padded to capacity with
        --moe-pad-expert-input-to-capacity."""
        c = self.config
        if not c.moe_pad_expert_input_to_capacity:
            return self.experts(routed, counts)
        size = self.share.padded_rows(local_tokens, c.moe_router_topk, c.num_experts, c.moe_expert_capacity_factor)
        cap = None  # FP8 experts fed by several micro-batches: padded as one process pads each micro-batch
        if self.experts.row_micro_batches is not None:
            cap = size // self.share.sources
            places = places_by_micro_batch(counts.by_source, self.experts.row_micro_batches[0], size, cap,
                                           routed.device)
        else:
            places = padded_places(counts, routed.shape[0], size)
        padded = pad_to_capacity(routed, places, len(counts), size)
        return unpad(self.experts(padded, TokenCounts.equal(size, len(counts), routed.device), cap), places)

    def _finish(self, out, hidden, aux):
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden)
        return aux_losses.attach(out, aux, self.router.backward_scale) if aux is not None else out

    def _folded_forward(self, hidden, sp):
        x = own_tokens(hidden, self.tp_group, sp)
        s, b, h = x.shape
        tokens = x.reshape(s * b, h)
        probs, indices, aux = self._route(tokens, s, b)
        routed, counts = self.dispatcher.dispatch(tokens, probs, indices, self.dropless)
        if self.etp is not None:
            routed, counts = self.etp.gather(routed, counts)
        expert_out = self._experts(routed, counts, s * b)
        if self.etp is not None:  # summed over expert TP before the probs weigh them, as above
            expert_out = self.etp.scatter(expert_out)
        out = all_tokens(self.dispatcher.combine(expert_out).view(s, b, h), self.tp_group, sp)
        return self._finish(out, hidden, aux)


def build_mlp(config, groups, layer_number, device=None):
    """The feed-forward block of layer `layer_number`: an MoELayer where config.is_moe_layer, else the
    dense MLP, with this rank's groups (ProcessGroups; stand-ins from ParallelLayout.plan_groups to build
    a shard on the meta device): EP when EP > 1, CP when CP > 1; folded, the expert-TP group and the
    TP x CP group in place of the CP one."""
    if not config.is_moe_layer(layer_number):
        return MLP(config, groups.tp, device, fp8_layer(config, layer_number), groups.cp)
    folded = groups.expert_folded
    cp_group = groups.tp_cp if folded else groups.cp
    ep_group = groups.ep if groups.ep_size > 1 else None
    # another rank routes part of the tokens
    share = token_share(groups, folded) if ep_group is not None or cp_group is not None else None
    layout = groups.layout
    return MoELayer(config, groups.tp, layer_number, ep_group, groups.ep_rank, device, cp_group,
                    groups.etp if folded else None, share, fp8_layer(config, layer_number), groups.ecp,
                    (layout.expert_row_micro_batches(groups.rank), layout.dp))
