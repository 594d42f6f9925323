"""One executor for every schedule: runs a rank's action list (schedules.py) on real model chunks.

Per microbatch and chunk it keeps only what backward needs: the received input (a leaf
whose .grad is sent back) and the output's autograd graph (its storage is freed once
sent, p2p.free_output). On the last virtual stage the output is the scaled loss.
"""
import time
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from .p2p import P2PCommunicator, backward_through, free_output
from .schedules import SCHEDULES, default_schedule


def as_chunks(model) -> list[nn.Module]:
    """A model, or a list / nn.ModuleList of model chunks (one per virtual stage), as a list."""
    return list(model) if isinstance(model, (list, tuple, nn.ModuleList)) else [model]


def _set_input_tensor(chunk, tensor):
    target = chunk.module if hasattr(chunk, "module") and not hasattr(chunk, "set_input_tensor") else chunk
    if hasattr(target, "set_input_tensor"):
        target.set_input_tensor(tensor)
    elif tensor is not None:
        raise TypeError(f"{type(target).__name__} has no set_input_tensor(); it cannot be a later pipeline stage")


DEFAULT_TERMS = {"lm loss": "loss_mask"}


def global_tokens(batches, groups):
    """Loss-mask tokens of the whole global batch (this rank's microbatches summed over groups.dp)."""
    return global_counts(batches, groups, DEFAULT_TERMS)[0]


def global_counts(batches, groups, loss_terms):
    """Per loss term, the elements it averages over in the whole global batch: [terms] fp32.

    loss_terms: {name: batch key of its mask [b, ...]}; key None counts one per sample.
    This rank's microbatches are summed, then all-reduced over groups.dp (one call).
    """
    def count(b, key):
        return b[key].float().sum() if key is not None else torch.tensor(
            float(b["tokens"].shape[0]), device=b["tokens"].device)
    n = torch.stack([torch.stack([count(b, key) for b in batches]).sum() for key in loss_terms.values()])
    if groups.dp_size > 1:
        dist.all_reduce(n, group=groups.dp)
    return n


class _Rank:
    """One rank's state while running a schedule. Per (chunk, mb) it holds the received
    input (a leaf whose .grad goes back), the output (its storage freed once sent; on the
    last virtual stage the scaled loss), the received output gradient and the input
    gradient waiting to be sent; each entry is dropped as soon as it is used.
    num_tokens: [terms] global counts, one per loss term (terms: their names, or None for
    forward_step's single (per-token loss, mask) pair)."""

    def __init__(self, chunks, batches, forward_step, groups, comm, num_tokens, forward_only, loss_scale=1.0,
                 terms=None):
        self.chunks, self.batches, self.forward_step = chunks, batches, forward_step
        self.loss_scale, self.terms = loss_scale, terms
        self.groups, self.comm, self.num_tokens, self.forward_only = groups, comm, num_tokens, forward_only
        self.inputs, self.outputs, self.out_grads, self.in_grads = {}, {}, {}, {}
        self.total = torch.zeros(num_tokens.shape, device=num_tokens.device)
        self.last_chunk = len(chunks) - 1 if groups.is_last_stage else None  # the chunk with the loss

    def forward(self, v, mb):
        if len(self.chunks) > 1:
            self.groups.vpp_rank = v  # the chunk now running, for code that asks
        key = (v, mb)
        _set_input_tensor(self.chunks[v], self.inputs.get(key))
        out, mask = self.forward_step(self.chunks[v], self.batches[mb])
        if v == self.last_chunk:
            if self.terms is None:
                sums = (out.float() * mask).sum().unsqueeze(0)
            else:  # {name: per-element loss}, {name: its mask}
                sums = torch.stack([(out[n].float() * mask[n]).sum() for n in self.terms])
            self.total += sums.detach()
            out = None if self.forward_only else (sums * (self.loss_scale / self.num_tokens)).sum()
        if out is not None:
            self.outputs[key] = out
        if self.forward_only:
            self.inputs.pop(key, None)

    def backward(self, v, mb):
        if len(self.chunks) > 1:
            self.groups.vpp_rank = v
        key = (v, mb)
        out, inp = self.outputs.pop(key), self.inputs.pop(key, None)
        if v == self.last_chunk:
            out.backward()
        else:
            backward_through(out, self.out_grads.pop(key))
        if inp is not None:
            self.in_grads[key] = inp.grad

    def communicate(self, ops):
        posted, received = [], []
        for op in ops:
            key = (op.chunk, op.mb)
            if op.kind == "send_fwd":
                posted.append(("send", self.outputs[key].detach(), op.peer))
            elif op.kind == "send_bwd":
                posted.append(("send", self.in_grads.pop(key), op.peer))
            else:
                buf = self.comm.buffer()
                posted.append(("recv", buf, op.peer))
                received.append((op.kind, key, buf))
        self.comm.exchange(posted)
        for op in ops:
            if op.kind == "send_fwd":  # the next stage has it now; backward needs only the graph
                key = (op.chunk, op.mb)
                if self.forward_only:
                    del self.outputs[key]
                else:
                    free_output(self.outputs[key])
        for kind, key, buf in received:
            if kind == "recv_bwd":
                self.out_grads[key] = buf
            else:
                self.inputs[key] = buf if self.forward_only else buf.requires_grad_()

    def kept_output_elems(self):
        return sum(o.numel() for (v, _), o in self.outputs.items() if v != self.last_chunk)


def run_actions(actions, chunks, batches, forward_step, groups, comm: Optional[P2PCommunicator],
                num_tokens, forward_only=False, trace: Optional[list] = None, stats: Optional[dict] = None,
                loss_scale=1.0, terms=None):
    """Execute `actions` on this rank. Returns sum(loss x mask) over this rank's microbatches
    per loss term ([terms] fp32; zero unless this rank holds the last virtual stage).

    Each microbatch's backward uses sum(loss x mask) / num_tokens (the global batch's token
    count), times loss_scale (fp16), as training without pipelining does. trace: gets (kind, chunk, mb, start, end)
    per action (time.perf_counter). stats: gets peak_in_flight (microbatch-chunks forwarded,
    not yet backwarded) and peak_kept_output_elems (elements of sent outputs still held).
    """
    r = _Rank(chunks, batches, forward_step, groups, comm, num_tokens, forward_only, loss_scale, terms)
    peak = peak_elems = 0
    sync = trace is not None and num_tokens.device.type == "cuda"
    for a in actions:
        t0 = time.perf_counter() if trace is not None else 0.0
        if a.kind == "F":
            r.forward(a.chunk, a.mb)
        elif a.kind == "B":
            r.backward(a.chunk, a.mb)
        else:
            r.communicate(a.ops)
        if stats is not None:
            peak = max(peak, len(r.outputs))
            if a.kind == "comm":  # outputs are sent at the next comm: count what stays after it
                peak_elems = max(peak_elems, r.kept_output_elems())
        if trace is not None:
            if sync:
                torch.cuda.synchronize(num_tokens.device)
            trace.append((a.kind, a.chunk, a.mb, t0, time.perf_counter()))
    assert not r.outputs and not r.in_grads and not r.out_grads, "the schedule left work undone"
    if stats is not None:
        stats.update(peak_in_flight=peak, peak_kept_output_elems=peak_elems)
    return r.total


def forward_backward(model, batches, forward_step, groups, forward_only=False, schedule=None,
                     seq_length=None, micro_batch_size=None, trace=None, stats=None, loss_scale=1.0,
                     loss_terms=None):
    """Run one iteration's microbatches through this rank's model chunks with a schedule.

    model: a model or a list of chunks (virtual stages, in order); batches: this DP rank's
    microbatches (dicts with tokens [b, s] and loss_mask [b, s], loaded on every stage);
    forward_step(chunk, batch) -> (output, loss_mask): per-token loss [b, s] on the last
    stage, else the hidden states [s(/TP), b, h] to send on.
    Returns the mean per-token loss of the global batch (fp32, summed over groups.dp) on
    the last pipeline stage, zero on the others. Gradients accumulate (DDP buffer or .grad);
    what is backpropagated is multiplied by loss_scale (fp16 loss scaling).

    Several losses (BERT's masked LM and sentence-order losses): loss_terms maps each name
    to the batch key of its mask (None: one per sample); forward_step then returns
    ({name: loss}, {name: mask}) on the last stage, each term is averaged over its own
    global count, the sum of the averages is backpropagated, and the result is
    {name: mean loss} instead of one tensor.
    """
    chunks = as_chunks(model)
    P, V, M = groups.pp_size, len(chunks), len(batches)
    name = schedule or default_schedule(P, V)
    actions = SCHEDULES[name](P, M, V, groups.pp_rank, forward_only)
    last = groups.is_last_stage
    device = next(chunks[0].parameters()).device
    # only the last stage computes a loss; the others skip the token count's all-reduce
    terms = loss_terms or DEFAULT_TERMS
    num_tokens = global_counts(batches, groups, terms) if last else torch.ones(len(terms), device=device)
    comm = None
    if P > 1:
        b, s = batches[0]["tokens"].shape
        b, s = micro_batch_size or b, seq_length or s
        cfg = getattr(chunks[0], "config", None) or chunks[0].module.config
        shape = (s // groups.tp_size if cfg.sequence_parallel else s, b, cfg.hidden_size)
        comm = _communicator(groups, shape, getattr(cfg, "pipeline_dtype", None) or cfg.params_dtype, device)
    total = run_actions(actions, chunks, batches, forward_step, groups, comm, num_tokens, forward_only, trace, stats,
                        loss_scale, list(loss_terms) if loss_terms else None)
    if last and groups.dp_size > 1:
        dist.all_reduce(total, group=groups.dp)
    means = total / num_tokens
    return dict(zip(loss_terms, means)) if loss_terms else means[0]


_COMM = [None]  # the last communicator, reused while groups, shape, dtype and device stay


def _communicator(groups, shape, dtype, device):
    c = _COMM[0]
    if c is None or c.groups is not groups \
            or (c.shape, c.dtype, c.device) != (tuple(shape), dtype, torch.device(device)):
        _COMM[0] = P2PCommunicator(groups, shape, dtype, device)
    return _COMM[0]
