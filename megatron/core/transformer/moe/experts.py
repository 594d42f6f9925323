"""The experts of one MoE layer held by this rank: an MLP each, split over TP like the dense MLP.

Biases split over expert TP as the dense MLP's: fc1's (column parallel) sharded like its weight, fc2's
(row parallel) replicated and added once to the sum over the expert-TP group. The experts' outputs
are partial sums that the caller reduces over that group (an all-reduce, or a reduce-scatter of
gathered rows when folded), after which each row belongs to one token's choice; fc2's bias is added
before it, on the group's first rank only, to exactly the rows the experts computed (no dropped pair
reaches them; capacity padding is cut off after), as one process adds it inside each expert. Every
rank takes the bias's gradient from the whole output gradient the reduction's backward hands it, so
the replicas stay equal (and are counted once: param_meta.counted_once).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...fp8.linear import RowBlocks, fp8_linear
from ...fp8.recipes import build_recipe
from ...tensor_parallel import wgrad_fusion
from ...tensor_parallel.param_meta import set_expert_parallel, set_init, set_tensor_parallel
from .grouped_gemm import grouped_experts, per_row


class ExpertMLP(nn.Module):
    """One expert: [n, h] -> [n, h], partial over TP (the caller sums over the TP group).

    linear_fc1 [ffn(x2 with SwiGLU)/TP, h] ([gate; up] blocks split separately, as the dense MLP),
    linear_fc2 [h, ffn/TP]; tp_size 1 (no TP, or expert TP 1): whole, replicated over TP. fc2's bias
    is added here only when whole (else LocalExperts adds it once over TP, see the module docstring).
    fp8: (settings, activation groups, weight groups) to run both GEMMs in FP8 (core/fp8), or None.
    """

    def __init__(self, config, tp_size, device=None, fp8=None):
        super().__init__()
        self.fc1_fp8 = self.fc2_fp8 = None
        if fp8 is not None:  # delayed scalers reduce their step amaxes over expert-DP (fp8/step.py)
            self.fc1_fp8, self.fc2_fp8 = build_recipe(*fp8, expert=True), build_recipe(*fp8, expert=True)
        ffn, h = config.expert_ffn_hidden_size, config.hidden_size
        self.swiglu = config.swiglu
        self.approximate = "tanh" if config.openai_gelu else "none"
        rows = ffn * (2 if config.swiglu else 1)
        kw = {"dtype": config.params_dtype, "device": device}
        self.fc1_weight = nn.Parameter(torch.empty(rows // tp_size, h, **kw))
        self.fc2_weight = nn.Parameter(torch.empty(h, ffn // tp_size, **kw))
        set_init(self.fc1_weight, "normal", config.init_method_std)
        set_init(self.fc2_weight, "normal", config.init_method_std / math.sqrt(2.0 * config.num_layers))
        if tp_size > 1:
            set_tensor_parallel(self.fc1_weight, 0, stride=2 if config.swiglu else 1)
            set_tensor_parallel(self.fc2_weight, 1)
        self.whole = tp_size == 1
        self.fc1_bias = self.fc2_bias = None
        if config.add_bias_linear:
            self.fc1_bias = nn.Parameter(torch.empty(rows // tp_size, **kw))
            self.fc2_bias = nn.Parameter(torch.empty(h, **kw))
            set_init(self.fc1_bias, "zeros")
            set_init(self.fc2_bias, "zeros")
            if tp_size > 1:
                set_tensor_parallel(self.fc1_bias, 0, stride=2 if config.swiglu else 1)
        for t in [*self.parameters(), *self.buffers()]:  # buffers: FP8 delayed scaling's, per expert too
            set_expert_parallel(t)

    def fp8_weights(self):
        """[(weight, its FP8 recipe)] of the GEMMs run in FP8 here (core/fp8/weights.py)."""
        if self.fc1_fp8 is None:
            return []
        return [(self.fc1_weight, self.fc1_fp8), (self.fc2_weight, self.fc2_fp8)]

    def activation(self, h):
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(h, approximate=self.approximate)

    def forward(self, x, blocks=None):
        """blocks: with FP8, x's rows per source rank and their micro-batches (fp8.linear.RowBlocks), or None."""
        h = self.activation(_linear(x, self.fc1_weight, self.fc1_bias, self.fc1_fp8, blocks))
        return _linear(h, self.fc2_weight, self.fc2_bias if self.whole else None, self.fc2_fp8, blocks)


def _linear(x, weight, bias, fp8, blocks=None):
    # gradient-accumulation fusion: the weight gradient added into DDP's buffer (FP8: fp8/linear.py deposits it)
    if fp8 is None:
        return wgrad_fusion.linear_or_fused(x, weight, bias)
    return fp8_linear(x, weight, bias, fp8, blocks)


class LocalExperts(nn.Module):
    """Experts first .. first+count-1 of a layer (this expert-parallel rank's share).

    Held in a ModuleDict keyed by the GLOBAL expert index, so parameter names (init keys,
    checkpoints) do not depend on the expert-parallel size. first_tp_rank: whether this rank is the
    first of the expert-TP group (split over tp_size > 1 ranks, it adds the fc2 biases). fp8: as
    ExpertMLP's; FP8 experts run one at a time (each with its own scales), not as a grouped matmul, and
    where their rows come from several source ranks (expert parallelism, folding) cast each micro-batch's rows
    apart, as one process casts each micro-batch: counts.by_source names each expert's rows per source, and
    row_micro_batches = (each source's micro-batch, how many there are; ParallelLayout.expert_row_micro_batches).
    """

    def __init__(self, config, first, count, tp_size, device=None, first_tp_rank=True, fp8=None,
                 row_micro_batches=None):
        super().__init__()
        self.first, self.count = first, count
        several = fp8 is not None and row_micro_batches and len(row_micro_batches[0]) > 1
        self.row_micro_batches = row_micro_batches if several else None  # FP8 casts per micro-batch
        self.grouped = config.moe_grouped_gemm and fp8 is None
        self.split_fc2_bias = tp_size > 1 and config.add_bias_linear
        self.first_tp_rank = first_tp_rank
        self.local_experts = nn.ModuleDict(
            {str(first + i): ExpertMLP(config, tp_size, device, fp8) for i in range(count)})

    def forward(self, x, counts, cap=None):
        """x [N, h]: tokens sorted by local expert, counts (token_counts.TokenCounts) of them for each
        -> [N, h], each row through its expert (TP-partial). No communication. The grouped path reads
        nothing on the host; the loop needs the sizes there (read once, if the dispatcher had not).
        cap: FP8 experts' input padded per micro-batch, `cap` rows each (capacity.places_by_micro_batch)."""
        experts = list(self.local_experts.values())
        if self.grouped:
            out = grouped_experts(experts, x, counts, fc2_bias=not self.split_fc2_bias)
        else:
            blocks = [None] * len(experts)
            if experts and self.row_micro_batches is not None:
                labels, n = self.row_micro_batches
                if cap is None:
                    blocks = [RowBlocks(rows, labels, n) for rows in counts.by_source]
                else:
                    batches = list(dict.fromkeys(labels))
                    blocks = [RowBlocks([cap] * len(batches), batches, n)] * len(experts)
            outs = [expert(chunk, b) for expert, chunk, b in zip(experts, x.split(counts.sizes()), blocks)]
            out = torch.cat(outs) if outs else x[:0]
        if self.split_fc2_bias and experts:
            biases = per_row(torch.stack([e.fc2_bias for e in experts]), counts, x.shape[0])
            out = _AddOnFirstRank.apply(out, biases, self.first_tp_rank)
        return out


class _AddOnFirstRank(torch.autograd.Function):
    """out + term where `add` (the expert-TP group's first rank), out unchanged elsewhere; term's
    gradient is out's on every rank (the group sums the outs next, so the term enters once)."""

    @staticmethod
    def forward(ctx, out, term, add):
        return out + term if add else out.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, grad, None
