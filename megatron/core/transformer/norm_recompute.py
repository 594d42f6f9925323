"""--recompute-modules layernorm (Megatron-Core's CheckpointWithoutOutput around the norms).

A plain checkpoint of a norm saves nothing: the module that reads the norm's output (the QKV or latent
down-projections, fc1, the router) keeps that output for its own backward. So the output is kept only until
the reader's forward is over, then its storage is freed; when the backward reaches the reader's output, a hook
runs the norm again into the same storage before any of the reader's backward reads it. Each layer saves its two
norm outputs (2 x 2 s b h bytes in 16 bits, / t with SP) for one more norm forward each in the backward. The
outputs are bitwise the plain path's (the same norm on the same input); so are the gradients, except that a norm
made of several ops (torch's fp32 RMSNorm) adds its two input-gradient terms before the residual's, not after:
one rounding apart.
"""
import torch


class _Recompute:
    """One norm call: its input, and its output until the hook has refilled it."""

    def __init__(self, norm, x):
        self.norm, self.x, self.output = norm, x, None
        self.rebuilt = self.x_detached = None  # the rebuilt output and its detached input, set by the refill

    def free(self, reader_output):
        """After the reader's forward: free the output's storage, refill it when the backward reaches the reader."""
        if not reader_output.requires_grad or reader_output.grad_fn is None:
            return
        self.output.untyped_storage().resize_(0)
        reader_output.grad_fn.register_prehook(self._refill)

    def _refill(self, *_):
        x = self.x.detach().requires_grad_(self.x.requires_grad)
        with torch.enable_grad():
            rebuilt = self.norm(x)
        storage = self.output.untyped_storage()
        storage.resize_(rebuilt.untyped_storage().nbytes())
        storage.copy_(rebuilt.untyped_storage())
        self.rebuilt, self.x_detached, self.output = rebuilt, x, None


class _NormWithoutOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, record, x):
        ctx.record = record
        ctx.save_for_backward(x)  # held by the record too (its refill runs first); saved so that hooks see it
        with torch.no_grad():
            out = record.norm(x)
        record.output = out
        return out

    @staticmethod
    def backward(ctx, grad):
        record, ctx.record = ctx.record, None
        if record.rebuilt is None:  # the reader's output had no grad_fn: nothing was freed
            record._refill()
        torch.autograd.backward(record.rebuilt, grad)
        x_grad = record.x_detached.grad
        record.rebuilt = record.x_detached = record.x = None
        return None, x_grad


def norm_then(norm, x, reader, *args):
    """reader(norm(x), *args), the norm's output freed after the reader's forward and rebuilt before its
    backward (training with gradients only; otherwise the plain path)."""
    if not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in norm.parameters()))):
        return reader(norm(x), *args)
    record = _Recompute(norm, x)
    out = reader(_NormWithoutOutput.apply(record, x), *args)
    record.free(out)
    return out
