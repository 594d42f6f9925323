"""A stack of transformer layers, optionally followed by the final norm, with full recompute."""
import contextlib

import torch
from torch import nn

from ..tensor_parallel.random import checkpoint
from .layer import TransformerLayer
from .norm import build_norm


class TransformerBlock(nn.Module):
    """Layers layer_offset+1 .. layer_offset+num_layers of the model, on this pipeline stage.

    [s(/TP), b, h] -> same (groups: this rank's ProcessGroups); final_layernorm only where post_process
    (last stage) and the layers are pre-norm (post-norm layers end with a norm already).
    With --recompute-granularity full only the inputs of checkpointed chunks are kept:
    uniform checkpoints every chunk of recompute_num_layers layers; block checkpoints the
    first recompute_num_layers layers of this stage one by one and keeps the rest.
    offload_first(offloader, n): what the first n layers keep for backward (after recompute) goes to the
    host (activation_offload.py; --cpu-offloading).
    """

    def __init__(self, config, groups, num_layers=None, layer_offset=0, post_process=True, device=None):
        super().__init__()
        self.config = config
        n = config.num_layers if num_layers is None else num_layers
        self.layer_offset = layer_offset
        self.layers = nn.ModuleList(
            TransformerLayer(config, groups, layer_offset + i + 1, device) for i in range(n))
        self.final_layernorm = build_norm(config, device) if post_process and not config.post_norm else None
        self.offload = None  # (ActivationOffloader, layers offloaded), set by offload_first

    def offload_first(self, offloader, num_layers) -> None:
        """Offload the saved tensors of this block's first num_layers layers (all of them if it has fewer)."""
        self.offload = (offloader, num_layers) if num_layers > 0 else None

    def _unit(self, first_layer):
        """The offload unit of a call starting at layer first_layer (no-op past the offloaded layers)."""
        if self.offload is None or first_layer >= self.offload[1] or not (self.training and torch.is_grad_enabled()):
            return contextlib.nullcontext()
        return self.offload[0].unit()

    def _chunk(self, start, end):
        def run(x, rope, attn_mask):
            for layer in self.layers[start:end]:
                x = layer(x, rope, attn_mask)
            return x
        return run

    def forward(self, x, rope=None, attn_mask=None, kv_cache=None):
        """x [s(/TP), b, h] -> same. kv_cache: None, or a KVCache for incremental decoding
        (kv_cache.py; no recompute then: decoding keeps no activations for backward)."""
        config = self.config
        if config.recompute_granularity == "full" and self.training and torch.is_grad_enabled() and kv_cache is None:
            n = config.recompute_num_layers
            if config.recompute_method == "uniform":
                for start in range(0, len(self.layers), n):
                    with self._unit(start):
                        x = checkpoint(self._chunk(start, start + n), x, rope, attn_mask)
            else:  # block
                for i, layer in enumerate(self.layers):
                    with self._unit(i):
                        x = checkpoint(layer, x, rope, attn_mask) if i < n else layer(x, rope, attn_mask)
        else:
            for i, layer in enumerate(self.layers):
                with self._unit(i):
                    x = layer(x, rope, attn_mask, kv_cache)
        return self.final_layernorm(x) if self.final_layernorm is not None else x
