"""Model FLOPs per iteration, for TFLOP/s and MFU.

Per token and layer, a forward pass does 2 FLOPs per multiply-add of every matrix
product: QKV 2h(h + 2 g d), scores and weighted values 4 s h (full square, as
Megatron-LM counts), output projection 2h^2, MLP 2 h f (x3 with SwiGLU, x2 with GeLU);
the logits add 2 h V per token. Training is 3x forward (backward costs twice forward);
activation recompute is not counted. For a standard GPT (f = 4h, g d = h) this is
Korthikanti et al.'s 72 B L s h^2 (1 + s/6h + V/12hL).
"""


def num_floating_point_operations(config, batch_size):
    """Model FLOPs of one training iteration over `batch_size` samples of config.seq_length."""
    c = config
    h, s, L = c.hidden_size, c.seq_length, c.num_layers
    kv = c.num_query_groups * c.kv_channels
    q = c.num_attention_heads * c.kv_channels
    per_layer = (2 * h * (q + 2 * kv) + 4 * s * q + 2 * q * h
                 + 2 * h * c.ffn_hidden_size * (3 if c.swiglu else 2))
    per_token = L * per_layer + 2 * h * c.padded_vocab_size
    return 3 * batch_size * s * per_token
