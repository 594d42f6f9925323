"""The three GEMMs of a linear y = x W^T in FP8, per recipe: forward (x, W), input gradient dx = g W
(g, W^T) and weight gradient dW = g^T x (g^T, x^T), each as a b^T with K the contraction dimension.

x and W are cast to the forward format, g to the gradient format (e5m2 with --fp8-format hybrid).
Per-tensor recipes (tensorwise, delayed) cast x and g once and transpose the FP8 copy for the backward
GEMMs (a transpose keeps a tensorwise scale). W is kept as the parameter itself (no FP8 copy per
microbatch in flight: that would cost the layer's weights in bytes per microbatch) and cast again in the
backward with the scale the forward used: the same FP8 values, one more elementwise cast. With
--fp8-param-gather the weight's FP8 copy is cast once per step from the DP shards and gathered as bytes
(distributed/fp8_param_gather.py): the GEMMs read that copy, the same values the cast here would give.
Blockwise tiles
run along K, which is another dimension in each GEMM: x and g are cast again in the backward (x is kept
in its own precision for it, as DeepSeek-V3's recipe keeps both orientations); W's 128x128 blocks
transpose with their scales.
"""
from torch import nn

from . import blockwise as bw
from .formats import formats, quantize
from .gemm import blockwise_mm, tensorwise_mm
from .scalers import CurrentScaler, DelayedScaler


class PerTensorRecipe(nn.Module):
    """Tensorwise current scaling or delayed scaling: one scale per tensor (input, weight, gradient),
    from the scalers (scalers.py). A module, so a delayed scaler's history is in the state dict."""

    def __init__(self, settings, act_groups, weight_groups, expert=False):
        super().__init__()
        fwd, bwd = formats(settings.fp8_format)
        self.fwd, self.bwd = fwd, bwd
        if settings.fp8_recipe == "delayed":
            def make(dtype, groups):
                return DelayedScaler(dtype, settings.fp8_margin, groups, settings.fp8_amax_history_len,
                                     settings.fp8_amax_compute_algo, expert)
            self.input, self.weight, self.grad = (make(fwd, act_groups), make(fwd, weight_groups),
                                                  make(bwd, act_groups))
        else:
            m = settings.fp8_margin
            self._current = (CurrentScaler(fwd, m, act_groups), CurrentScaler(fwd, m, weight_groups),
                             CurrentScaler(bwd, m, act_groups))
        self._weight_copy = None  # --fp8-param-gather's FP8 copy of the weight (use_weight_copy)

    def _scalers(self):
        return self._current if hasattr(self, "_current") else (self.input, self.weight, self.grad)

    def delayed_scalers(self):
        return [] if hasattr(self, "_current") else [self.input, self.weight, self.grad]

    def weight_scaler(self):
        """The weight's scaler: its groups are those holding pieces of the weight; scale_of_amax gives the scale."""
        return self._scalers()[1]

    def use_weight_copy(self, copy):
        """From now on the GEMMs read the weight's FP8 values from `copy` (.data: FP8 [N, K], .scale: 0-d fp32;
        distributed/fp8_param_gather.py keeps both current) instead of casting the parameter."""
        self._weight_copy = copy

    def forward_gemms(self, xs, w, labels=None, n=None):
        """xs: row blocks [M_i, K] of the input, each one micro-batch's (labels: their micro-batches, distinct, of
        n; None: one block, the whole tensor), w [N, K] -> [(fp32 y_i [M_i, N], what the backward GEMMs need)].
        Each block is cast with its micro-batch's scale, the weight once."""
        sin, sw, _ = self._scalers()
        s_xs = [sin.scale(xs[0])] if labels is None else sin.scales(xs, labels, n)
        if self._weight_copy is None:
            s_w = sw.scale(w)
            wq = quantize(w, s_w, self.fwd)
        else:  # the copy's scale is rewritten in place at the next step's cast: the backward keeps its own
            wq, s_w = self._weight_copy.data, self._weight_copy.scale.clone()
        kept_w = w if self._weight_copy is None else wq
        out = []
        for x, s_x in zip(xs, s_xs):
            xq = quantize(x, s_x, self.fwd)
            out.append((tensorwise_mm(xq, 1 / s_x, wq, 1 / s_w), (xq, 1 / s_x, kept_w, s_w)))
        return out

    def cast_grads(self, gs, labels=None, n=None):
        """The output gradient's blocks (as forward_gemms' xs) cast, each with its micro-batch's scale."""
        scaler = self._scalers()[2]
        s_gs = [scaler.scale(gs[0])] if labels is None else scaler.scales(gs, labels, n)
        return [(quantize(g, s_g, self.bwd), 1 / s_g) for g, s_g in zip(gs, s_gs)]

    def dgrad(self, gc, saved):
        gq, g_inv = gc
        _, _, w, s_w = saved  # w: the parameter, or its FP8 copy (--fp8-param-gather)
        wq = w if w.dtype == self.fwd else quantize(w, s_w, self.fwd)
        return tensorwise_mm(gq, g_inv, wq.t(), 1 / s_w)

    def wgrad(self, gc, saved):
        gq, g_inv = gc
        xq, x_inv, _, _ = saved
        return tensorwise_mm(gq.t(), g_inv, xq.t(), x_inv)


class BlockwiseRecipe(nn.Module):
    """1x128 tiles for x and g along each GEMM's K, 128x128 blocks for W. No amax reduction (blockwise.py)."""

    def __init__(self, settings, act_groups=(), weight_groups=()):
        super().__init__()
        self.fwd, self.bwd = formats(settings.fp8_format)
        self.margin = settings.fp8_margin

    def delayed_scalers(self):
        return []

    def forward_gemms(self, xs, w, labels=None, n=None):
        """As PerTensorRecipe's: each block's tiles start at its first row, as one process's micro-batch's."""
        wq, s_w = bw.quantize_blocks(w, self.fwd, self.margin)
        w_inv = bw.block_rows(1 / s_w, w.shape[0])
        out = []
        for x in xs:
            xq, s_x = bw.quantize_tiles(x, self.fwd, self.margin)
            out.append((blockwise_mm(xq, 1 / s_x, wq, w_inv), (x, w, s_w)))
        return out

    def cast_grads(self, gs, labels=None, n=None):
        return list(gs)

    def dgrad(self, g, saved):
        _, w, s_w = saved
        wq = quantize(w, bw.expand(s_w, *w.shape, bw.TILE), self.fwd)
        gq, s_g = bw.quantize_tiles(g, self.bwd, self.margin)
        return blockwise_mm(gq, 1 / s_g, wq.t().contiguous(), bw.block_rows(1 / s_w.t(), wq.shape[1]))

    def wgrad(self, g, saved):
        x = saved[0]
        gq, s_g = bw.quantize_tiles(g.t(), self.bwd, self.margin)
        xq, s_x = bw.quantize_tiles(x.t(), self.fwd, self.margin)
        return blockwise_mm(gq, 1 / s_g, xq, 1 / s_x)


def build_recipe(settings, act_groups, weight_groups, expert=False):
    """The recipe module of one linear (settings: the FP8 fields of the config); expert: an MoE expert's, whose
    delayed step amaxes reduce over expert-DP (the ranks holding the same expert), not DP x CP."""
    if settings.fp8_recipe == "blockwise":
        return BlockwiseRecipe(settings)
    if settings.fp8_recipe in ("tensorwise", "delayed"):
        return PerTensorRecipe(settings, act_groups, weight_groups, expert)
    raise ValueError(f"--fp8-recipe {settings.fp8_recipe} is not built")
