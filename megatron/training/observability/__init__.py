"""What a run reports: progress lines, TensorBoard / W&B scalars, metrics jsonl, FLOPs and MFU, memory, the profiler."""
