"""Sliding-window attention and attention sinks: Megatron-LM's flags, defaults and meanings.

--window-size L,R: a query at position i sees the keys at i - L .. i + R (-1: no bound); with the causal
mask R is 0 here. --window-attn-skip-freq N: every N-th layer (layer_number % N == 0) keeps full
attention, the others the window; or a 0/1 pattern, one per layer (1: window), as Megatron-Core's
is_layer_window_attention. --softmax-type off-by-one adds 1 to each softmax denominator (a sink logit
0 per head, Miller's "attention is off by one"); learnable would make it a parameter per head.
"""
from dataclasses import dataclass

from ..config_fields import flag_namer, opt
from ..errors import ConfigError
from .moe.layer_pattern import moe_freq


def window_tuple(text):
    """'128,0' or '(128,0)' -> (128, 0) (argparse type)."""
    parts = tuple(int(p) for p in str(text).strip("()' \"").split(","))
    if len(parts) != 2:
        raise ValueError(f"--window-size {text!r}: give two integers, left,right")
    return parts


@dataclass
class WindowConfig:
    window_size: tuple | None = opt(
        None, "Sliding-window attention: left,right (a query sees i - left .. i + right; -1 no bound; right "
        "must be 0 with the causal mask). Default: no window.", parse=window_tuple)
    window_attn_skip_freq: int | list | None = opt(
        None, "Layers that keep full attention among the windowed: every N-th (its number a multiple of N), or "
        "a pattern such as '[1,1,1,0]*3' (1: window). Default: every layer windowed.", parse=moe_freq)
    softmax_type: str = opt("vanilla", "Attention softmax: vanilla, or off-by-one (1 added to each denominator: "
                            "an attention sink). learnable (a sink logit per head) is not built here.",
                            choices=["vanilla", "off-by-one", "learnable"])

    def layer_window(self, layer_number):
        """This layer's left window (an int), or None for full (causal) attention; layer_number counts from 1."""
        if not self.window_size or self.window_size[0] < 0:
            return None
        freq = self.window_attn_skip_freq
        if freq is None:
            return self.window_size[0]
        windowed = bool(freq[layer_number - 1]) if isinstance(freq, list) else layer_number % freq != 0
        return self.window_size[0] if windowed else None

    def describe_window(self):
        """One start-up line, or None without a window or sink."""
        windows = [self.layer_window(i) for i in range(1, self.num_layers + 1)]
        if all(w is None for w in windows) and self.attention_sink() is None:
            return None
        return (f"> attention window / sink: window {self.window_size} on layers "
                f"{[i + 1 for i, w in enumerate(windows) if w is not None]}, softmax {self.softmax_type}: explicit "
                "scores per document (fusions/document_attention.windowed; memory O(document length^2))")

    def attention_sink(self):
        """The sink logit added to every softmax denominator (off-by-one: 0.0), or None."""
        return 0.0 if self.softmax_type == "off-by-one" else None


def check_window(cfg):
    """Refuses what the window and sink flags cannot mean here. Raises ConfigError."""
    f = flag_namer(cfg)
    if cfg.window_size is not None and cfg.window_size[1] not in (0, -1):
        raise ConfigError(f"{f('window_size')} {cfg.window_size}: a causal model sees no later key; give right 0")
    freq = cfg.window_attn_skip_freq
    if isinstance(freq, list) and len(freq) != cfg.num_layers:
        raise ConfigError(f"{f('window_attn_skip_freq')} gives {len(freq)} layers, the model has {cfg.num_layers}")
    if isinstance(freq, int) and freq < 1:
        raise ConfigError(f"{f('window_attn_skip_freq')} must be at least 1, got {freq}")
    if cfg.softmax_type == "learnable":
        raise ConfigError(f"{f('softmax_type')} learnable (a sink logit per head) is not built here; use "
                          "vanilla or off-by-one")
