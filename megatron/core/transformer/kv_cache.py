"""Keys and values kept between forwards for incremental (autoregressive) decoding."""
import torch


class KVCache:
    """Per layer, the rotated keys and the values of every token processed so far (multi-latent attention:
    the normed KV latent and the rotated shared key instead, mla.py).

    Give the same cache to each forward of one generation: the first forward takes the prompt,
    the next ones a token at a time. A forward attends over the cached tokens plus its own
    (causally) and appends its keys and values, so `seq_len` is also the absolute position of
    the next input's first token. Tensors are this TP rank's query groups, [s, b, groups/TP, d].
    """

    def __init__(self):
        self._layers = {}  # layer_number -> (keys, values)

    @property
    def seq_len(self):
        """Tokens cached so far (every layer holds the same number between forwards)."""
        if not self._layers:
            return 0
        return next(iter(self._layers.values()))[0].shape[0]

    def extend(self, layer_number, keys, values):
        """Append `layer_number`'s keys / values [s_new, b, groups, d]; return all of them [s_past + s_new, ...]."""
        past = self._layers.get(layer_number)
        if past is not None:
            keys, values = torch.cat([past[0], keys]), torch.cat([past[1], values])
        self._layers[layer_number] = (keys, values)
        return keys, values


def causal_mask_after(past, new, device):
    """Bool [1, 1, new, past + new], True = attend: query i sits at position past + i and sees keys 0 .. past + i."""
    keys = torch.arange(past + new, device=device)
    queries = past + torch.arange(new, device=device)
    return (keys[None, :] <= queries[:, None])[None, None]
