"""--optimizer-cpu-offload / --optimizer-offload-fraction: the optimizer state (fp32 main values,
Adam moments) of a fraction of this rank's pieces, and their update, on the host.

An offloaded piece has its own host copies, never aliases of the model's storage, even for an fp32
model on a CPU machine, so the same code path runs here as on a GPU: before the update its
(unscaled, clipped) gradient is copied from the device buffer into a host tensor; a second AdamW,
on the host, updates it; the new value is copied back into the parameter (or its ZeRO-3 shard).
Grad-norm, clipping and the fp16 overflow check run on the device gradients, before the copy.

Which pieces: the first ones in buffer order (the last layers' first) until `fraction` of this
rank's optimizer elements are on the host (Megatron's --optimizer-offload-fraction).
"""
import torch

HOST = torch.device("cpu")


def offloaded(sizes, fraction):
    """For pieces of `sizes` elements (buffer order): whether each goes to the host."""
    budget = fraction * sum(sizes)
    out, used = [], 0
    for n in sizes:
        out.append(fraction > 0 and used + n <= budget + 1e-9)
        used += n if out[-1] else 0
    return out


def host_copy(t):
    """A host fp32 copy of t, pinned when t lives on a GPU (for faster copies)."""
    out = torch.empty(t.shape, dtype=torch.float32, device=HOST, pin_memory=t.device.type == "cuda")
    return out.copy_(t)
