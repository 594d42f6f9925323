"""The word embedding shared by the first stage (input lookup) and the last (output layer)."""
import torch
import torch.distributed as dist


def allreduce_tied_embedding_grads(model, groups):
    """Sum the tied embedding's gradient over groups.embd (first and last pipeline stage).

    Both copies start equal (same init_key), so with the same summed gradient and the same
    optimizer step they stay equal. Parameters are found by their `shared_embedding` mark
    (GPTModel sets it when the table is on two stages); other ranks have none and return.
    """
    if groups.pp_size == 1:
        return
    for p in model.parameters():
        if getattr(p, "shared_embedding", False):
            grad = p.main_grad if hasattr(p, "main_grad") else p.grad
            if grad is None:  # a stage whose microbatches never touched it: contribute zero
                grad = p.grad = torch.zeros_like(p)
            dist.all_reduce(grad, group=groups.embd)
