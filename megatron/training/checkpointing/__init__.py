"""Saving and loading training state (model, optimizer, RNG, model buffers) and which checkpoint a run loads."""
