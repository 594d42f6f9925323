"""The pretrain loop: start-up, the iteration (micro-batches, reduce, clip, step), and what stops a run."""
