"""A stack of transformer layers, optionally followed by the final norm."""
from torch import nn

from .layer import TransformerLayer
from .norm import build_norm


class TransformerBlock(nn.Module):
    """Layers layer_offset+1 .. layer_offset+num_layers of the model, on this pipeline stage.

    [s(/TP), b, h] -> same; final_layernorm only where post_process (last stage).
    """

    def __init__(self, config, tp_group, num_layers=None, layer_offset=0, post_process=True, device=None):
        super().__init__()
        n = config.num_layers if num_layers is None else num_layers
        self.layer_offset = layer_offset
        self.layers = nn.ModuleList(
            TransformerLayer(config, tp_group, layer_offset + i + 1, device) for i in range(n))
        self.final_layernorm = build_norm(config, device) if post_process else None

    def forward(self, x, rope=None, attn_mask=None):
        for layer in self.layers:
            x = layer(x, rope, attn_mask)
        return self.final_layernorm(x) if self.final_layernorm is not None else x
