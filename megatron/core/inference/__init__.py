"""Text generation from checkpoints (KV cache, greedy and sampled decoding)."""
