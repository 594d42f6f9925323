"""Global batches sliced over data-parallel ranks and microbatches.

Iteration k uses samples [c, c + G) of the dataset (c = samples consumed so far,
G = global batch). They are cut into chunks of micro x DP; DP rank r takes slice
[r x micro, (r+1) x micro) of each chunk. Which samples form a global batch therefore
never depends on the layout.
"""
import numpy as np
import torch

from ..core.datasets import MockGPTDataset, StdlibCorpusDataset


def build_datasets(train_cfg, model_cfg, tokenizer):
    """(train, valid) datasets for the configured source."""
    s, seed = model_cfg.seq_length, train_cfg.seed
    if train_cfg.mock_data:
        n = train_cfg.train_iters * train_cfg.global_batch_size
        return (MockGPTDataset(n, s, tokenizer.vocab_size, seed, tokenizer.eod),
                MockGPTDataset(max(1, train_cfg.eval_iters) * train_cfg.global_batch_size, s,
                               tokenizer.vocab_size, seed + 1, tokenizer.eod))
    args = dict(seq_length=s, seed=seed, max_bytes=train_cfg.embedded_corpus_bytes, eod=tokenizer.eod)
    return StdlibCorpusDataset("train", **args), StdlibCorpusDataset("valid", **args)


def microbatches(dataset, consumed, global_batch, micro, dp_rank, dp_size, device):
    """This DP rank's microbatches of the global batch starting at sample `consumed`.

    Each is a dict of tokens [micro, s], labels [micro, s], loss_mask [micro, s] (fp32).
    """
    out = []
    for start in range(consumed, consumed + global_batch, micro * dp_size):
        first = start + dp_rank * micro
        tokens = np.stack([dataset[i % len(dataset)]["tokens"] for i in range(first, first + micro)])
        t = torch.from_numpy(tokens).to(device)
        out.append({"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous(),
                    "loss_mask": torch.ones(t[:, 1:].shape, dtype=torch.float32, device=device)})
    return out
