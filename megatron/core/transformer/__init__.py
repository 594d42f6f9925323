"""Transformer building blocks in [s, b, h] layout, tensor- and sequence-parallel."""
