"""Gradient reduction across data-parallel (and TP, for sequence-parallel weights) ranks."""
from .finalize import finalize_model_grads
