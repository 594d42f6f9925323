"""The MoE layer: router, token dispatch over the expert-parallel group, local experts, shared experts."""
import dataclasses

from torch import nn

from ... import comm
from ...fp8.config import fp8_layer
from ...parallel_layout import sequence_split
from ...tensor_parallel import mappings
from ...tensor_parallel.param_meta import set_sequence_parallel
from ..mlp import MLP
from . import aux_losses
from .capacity import pad_to_capacity, padded_places, places_by_micro_batch, unpad
from .experts import LocalExperts
from .folding import ExpertTPGather, all_tokens, own_tokens
from .placement import expert_placement
from .router import TopKRouter
from .shared_experts import SharedExpertMLP
from .token_counts import TokenCounts
from .token_dispatcher import build_dispatcher


class MoELayer(nn.Module):
    """[s(/TP with SP), b, h] -> same, in place of the dense MLP of layer `layer_number`, placed by `placement`
    (placement.ExpertPlacement: this rank's groups for the layer, from the layout).

    Tokens are replicated over TP (gathered first with sequence parallelism); the experts are
    split over TP like the dense MLP, so their outputs are summed over TP before combine.
    Experts are split over the EP group in blocks of E / EP, this rank holding block ep_rank. The router's
    losses join backward through the output; its statistics are reduced over the token group (router.py).
    Folded (the layout's expert TP differs from TP, parallel_layout.py): each TP rank routes its own tokens
    (folding.py), the token group is the TP x CP group, the experts are split over expert TP and the groups
    are the folded expert grid's.
    share: this rank's part of the micro-batch (token_share.py), for the capacity rule and the padded expert
    input. fp8: FP8 settings (core/fp8/config.py) or None. Each expert's input holds this micro-batch's tokens
    routed to it, replicated over TP and split over CP: its amaxes are reduced over both, the TP-split
    weights' and hidden activations' over TP. Under EP or folding it holds rows from several source ranks
    (row_micro_batches); each micro-batch's rows are cast together, apart from the others' (experts.py),
    their amaxes reduced over expert TP (the same rows on every expert-TP rank, gathered when folded) and over
    expert_cp (groups.ecp: the ranks holding the same experts and rows of the same micro-batches). Padded to
    capacity, such an input is padded per micro-batch (capacity.places_by_micro_batch), each one process's
    padded input.
    """

    def __init__(self, config, placement, layer_number, device=None, fp8=None):
        super().__init__()
        where = placement
        self.config, self.tp_group = config, where.tp
        self.tp_size = comm.world(where.tp)
        self.folded = where.folded
        self.etp = ExpertTPGather(where.expert_tp, fp8 is not None) if self.folded and where.expert_tp else None
        # not folded, the experts are split over TP like the dense MLP (TP 1: no TP collective around them)
        self.expert_tp = None if self.folded else where.expert_tp
        count = config.num_experts // where.ep_size
        self.ep, self.share = where.ep_size, where.share
        self.dropless = config.moe_expert_capacity_factor is None
        self.router = TopKRouter(config, layer_number, device, where.token_group)
        split_over = where.expert_tp  # the experts' TP (or expert-TP) shards, None when whole
        expert_fp8 = None if fp8 is None else (fp8, (split_over, where.expert_cp), (split_over,))
        self.experts = LocalExperts(config, where.ep_rank * count, count, where.expert_tp_size, device,
                                    first_tp_rank=where.expert_tp_rank == 0, fp8=expert_fp8,
                                    row_micro_batches=where.row_micro_batches)
        if self.folded:  # each TP rank routes other tokens: the router's gradient is summed over TP
            set_sequence_parallel(self.router.weight)
        self.dispatcher = build_dispatcher(config.moe_token_dispatcher_type, config.num_experts,
                                           where.ep_rank * count, count, where.ep, by_source=fp8 is not None)
        self.shared_experts = None
        if config.moe_shared_expert_intermediate_size:
            shared = dataclasses.replace(config, ffn_hidden_size=config.moe_shared_expert_intermediate_size)
            self.shared_experts = SharedExpertMLP(shared, where.tp, device, fp8, where.token_group)

    def forward(self, hidden):
        sp = sequence_split(self.config.sequence_parallel, self.tp_size)
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
    a shard on the meta device); the MoE layer's from them by placement.expert_placement."""
    if not config.is_moe_layer(layer_number):
        return MLP(config, groups.tp, device, fp8_layer(config, layer_number), groups.cp)
    return MoELayer(config, expert_placement(groups), layer_number, device, fp8_layer(config, layer_number))
