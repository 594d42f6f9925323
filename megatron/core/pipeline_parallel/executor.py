"""One executor for every schedule: runs a rank's action list (schedules.py) on real model chunks.

Per microbatch and chunk it keeps only what backward needs: the received input (a leaf
whose .grad is sent back) and the output's autograd graph (its storage is freed once
sent, p2p.free_output). On the last virtual stage the output is the scaled loss.
The loss contract (named terms, their counts and sums) is in losses.py.
A schedule with W actions (zero_bubble.py) splits each backward on its autograd graph
(backward_split.py): B computes the input gradient and keeps what W needs, W the weight gradients.
ZB-V (zb_v.py, v_shape): the loss is on rank 0's chunk 1; on the last rank chunk 0's output is
chunk 1's input, and chunk 1's input gradient chunk 0's output gradient, without a message;
activations and gradients travel on two ordered channels (groups.pp and groups.pp_grad, p2p.py).
"""
import functools
import time

import torch
import torch.distributed as dist
from torch import nn

from ..timers import NULL_TIMER
from ..watchdog import waiting
from .backward_split import backward_input
from .losses import TOKEN_LOSS, LossDeclaration, ReducedLosses, global_counts, loss_divisors, masked_sums
from .p2p import ACTIVATIONS, GRADIENTS, P2PCommunicator, backward_through, free_output
from .schedules import SCHEDULES, default_schedule
from .zb_v import zb_v


def as_chunks(model) -> list[nn.Module]:
    """A model, or a list / nn.ModuleList of model chunks (one per virtual stage), as a list."""
    return list(model) if isinstance(model, (list, tuple, nn.ModuleList)) else [model]


def _set_input_tensor(chunk, tensor):
    if hasattr(chunk, "set_input_tensor"):
        chunk.set_input_tensor(tensor)
    elif tensor is not None:
        raise TypeError(f"{type(chunk).__name__} has no set_input_tensor(); it cannot be a later pipeline stage")


class _Rank:
    """One rank's state while running a schedule. Per (chunk, mb) it holds the received
    input (a leaf whose .grad goes back), the output (its storage freed once sent; on the
    last virtual stage the scaled loss), the received output gradient and the input
    gradient waiting to be sent; each entry is dropped as soon as it is used.
    num_tokens: what each microbatch's loss sums are divided by (losses.loss_divisors): [terms], or
    [microbatches, terms] per microbatch, for the loss terms `names` in that order."""

    def __init__(self, chunks, batches, forward_step, groups, comm, num_tokens, names, forward_only, loss_scale,
                 v_shape=False, before_weight=None):
        self.chunks, self.batches, self.forward_step = chunks, batches, forward_step
        self.loss_scale, self.names = loss_scale, names
        self.comm, self.num_tokens, self.forward_only = comm, num_tokens, forward_only
        self.inputs, self.outputs, self.out_grads, self.in_grads = {}, {}, {}, {}
        self.weight_work, self.split = {}, False  # split: B leaves the weight gradients to W
        self.before_weight = before_weight
        self.order = {}  # chunk -> {id(parameter): index}: W's order
        self.unwaited_sends = []
        self.total = torch.zeros(num_tokens.shape[-1:], device=num_tokens.device)
        self.last_chunk = len(chunks) - 1 if groups.is_last_stage else None  # the chunk with the loss
        self.v_shape, self.turn = v_shape, v_shape and groups.is_last_stage  # turn: chunk 0 feeds chunk 1 here
        if v_shape:
            self.last_chunk = 1 if groups.is_first_stage else None

    def forward(self, v, mb):
        key = (v, mb)
        _set_input_tensor(self.chunks[v], self.inputs.get(key))
        out = self.forward_step(self.chunks[v], self.batches[mb])
        if v == self.last_chunk:
            sums = masked_sums(out, self.names)
            self.total += sums.detach()
            divisor = self.num_tokens[mb] if self.num_tokens.dim() == 2 else self.num_tokens
            out = None if self.forward_only else (sums * (self.loss_scale / divisor)).sum()
        if out is not None:
            self.outputs[key] = out
        if self.turn and v == 0:
            self.inputs[(1, mb)] = out.detach() if self.forward_only else out.detach().requires_grad_()
            if self.forward_only:
                del self.outputs[key]
        if self.forward_only:
            self.inputs.pop(key, None)

    def backward(self, v, mb):
        key = (v, mb)
        out, inp = self.outputs.pop(key), self.inputs.pop(key, None)
        grad = None if v == self.last_chunk else self.out_grads.pop(key)
        if self.split:
            if v not in self.order:
                params = self.chunks[v].parameters() if isinstance(self.chunks[v], nn.Module) else ()
                self.order[v] = {id(p): i for i, p in enumerate(params)}
            self.weight_work[key] = backward_input(out, grad, inp, self.order[v])
        elif grad is None:
            out.backward()
        else:
            backward_through(out, grad)
        if inp is not None:
            self.in_grads[key] = inp.grad
        if self.turn and v == 1:
            self.out_grads[(0, mb)] = self.in_grads.pop(key)

    def weight(self, v, mb):
        self.weight_work.pop((v, mb)).run(self.before_weight)

    def communicate(self, ops, async_sends=False):
        posted, received = [], []
        for op in ops:
            key = (op.chunk, op.mb)
            # ZB-V: gradients on a channel of their own (groups.pp_grad); other schedules need one
            channel = GRADIENTS if self.v_shape and op.kind.endswith("bwd") else ACTIVATIONS
            if op.kind == "send_fwd":
                posted.append(("send", self.outputs[key].detach(), op.peer, channel))
            elif op.kind == "send_bwd":
                posted.append(("send", self.in_grads.pop(key), op.peer, channel))
            else:
                buf = self.comm.buffer()
                posted.append(("recv", buf, op.peer, channel))
                received.append((op.kind, key, buf))
        self.comm.exchange(posted, self.unwaited_sends if async_sends else None)
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


def run_actions(actions, chunks, batches, forward_step, groups, comm: P2PCommunicator | None,
                num_tokens, names, forward_only=False, trace: list | None = None, stats: dict | None = None,
                loss_scale=1.0, v_shape=False, before_weight=None, timers=None):
    """Execute `actions` on this rank. Returns sum(loss x mask) over this rank's microbatches
    per loss term of `names` ([terms] fp32; zero unless this rank holds the last virtual stage).

    Each microbatch's backward uses sum(loss x mask) / num_tokens (the global batch's count
    per term), times loss_scale (fp16), as training without pipelining does. trace: gets (kind, chunk, mb, start, end)
    per action (time.perf_counter). stats: gets peak_in_flight (microbatch-chunks forwarded,
    not yet backwarded, or not yet through W where the schedule has W's) and
    peak_kept_output_elems (elements of sent outputs still held); a callable stats["probe"] is
    called after every action with what the rank holds: outputs {(chunk, mb): tensor whose graph
    backward needs} and weight work {(chunk, mb): backward_split.WeightWork} (bench/pipeline_memory.py).
    v_shape: the actions are zb_v's (chunks in a V, the loss on rank 0's chunk 1). before_weight: called
    with parameters before a W action computes their gradients (DistributedDataParallel.before_weight_grads).
    timers: core.timers.Timers; at level 2 each action is timed under Megatron-LM's name (Action.timer_name).
    """
    r = _Rank(chunks, batches, forward_step, groups, comm, num_tokens, names, forward_only, loss_scale, v_shape,
              before_weight)
    r.split = any(a.kind == "W" for a in actions)
    peak = peak_elems = 0
    probe = stats.get("probe") if stats is not None else None
    sync = trace is not None and num_tokens.device.type == "cuda"
    per_action = timers is not None and timers.log_level >= 2
    for a in actions:
        t0 = time.perf_counter() if trace is not None else 0.0
        with timers(a.timer_name(), 2) if per_action else NULL_TIMER:
            if a.kind == "F":
                r.forward(a.chunk, a.mb)
            elif a.kind == "B":
                r.backward(a.chunk, a.mb)
            elif a.kind == "W":
                r.weight(a.chunk, a.mb)
            else:
                r.communicate(a.ops, a.async_sends)
        if stats is not None:
            peak = max(peak, len(r.outputs.keys() | r.weight_work.keys()))  # held until B, or W
            if a.kind == "comm":  # outputs are sent at the next comm: count what stays after it
                peak_elems = max(peak_elems, r.kept_output_elems())
            if probe is not None:
                probe(r.outputs, r.weight_work)
        if trace is not None:
            if sync:
                torch.cuda.synchronize(num_tokens.device)
            trace.append((a.kind, a.chunk, a.mb, t0, time.perf_counter()))
    if r.unwaited_sends:
        with waiting("pipeline sends", groups.pp):
            for req, _ in r.unwaited_sends:
                req.wait()
    assert not r.outputs and not r.in_grads and not r.out_grads and not r.weight_work, \
        "the schedule left work undone"
    if stats is not None:
        stats.update(peak_in_flight=peak, peak_kept_output_elems=peak_elems)
    return r.total


def forward_backward(model, batches, forward_step, groups, loss_terms: LossDeclaration = TOKEN_LOSS,
                     forward_only=False, schedule=None, trace=None, stats=None, loss_scale=1.0,
                     before_weight=None, timers=None, per_token_loss=True) -> ReducedLosses:
    """Run one iteration's microbatches through this rank's model chunks with a schedule.

    model: a model or a list of chunks (virtual stages, in order); batches: this DP rank's
    microbatches (dicts with tokens [b, s] and the masks loss_terms names, loaded on every
    stage); forward_step(chunk, batch) -> losses.LossTerms on the last stage, else the
    hidden states [s(/TP), b, h] to send on.
    Returns {term: (sum of loss x mask, count)} over the global batch (summed over groups.dp);
    the sums are 0 off the last pipeline stage, the counts are right on every stage. Each
    term's backward is its sum over its global count (so the mean per element of the global
    batch, whatever the layout; per_token_loss=False: Megatron-LM's default, the mean over the global
    batch's microbatches of each microbatch's mean, losses.loss_divisors), the terms' means are added,
    and what is backpropagated is multiplied by loss_scale (fp16 loss scaling). Gradients accumulate
    (DDP buffer or .grad).
    Collectives: one all-reduce of the counts over groups.dp before the schedule, p2p over
    groups.pp during it (ZB-V: gradients over groups.pp_grad), one all-reduce of the sums over
    groups.dp on the last stage after. before_weight(params): called before a zero-bubble W computes
    params' gradients (ZeRO-3 gathers them there: DistributedDataParallel.before_weight_grads). timers:
    core.timers.Timers for level 2's per-action timers, or None.
    """
    chunks = as_chunks(model)
    P, V, M = groups.pp_size, len(chunks), len(batches)
    schedule = schedule or groups.layout.schedule or default_schedule(P, V)  # the layout's when not given
    v_shape = schedule == "zb_v"  # chunks built in a V (ParallelLayout.v_shape)
    actions = (zb_v if v_shape else SCHEDULES[schedule])(P, M, V, groups.pp_rank, forward_only)
    names = list(loss_terms)
    counts = global_counts(batches, groups, loss_terms)
    divisors = counts if per_token_loss or forward_only else loss_divisors(batches, groups, loss_terms, False)
    comm = None
    if P > 1:  # a communicator is a few fields: one per call, no state kept between calls
        b, s = batches[0]["tokens"].shape
        cfg = chunks[0].config
        shape = (s // groups.tp_size if cfg.sequence_parallel else s, b, cfg.hidden_size)
        comm = P2PCommunicator(groups, shape, cfg.params_dtype, counts.device, grad_channel=v_shape)
    total = run_actions(actions, chunks, batches, forward_step, groups, comm, divisors, names, forward_only, trace,
                        stats, loss_scale, v_shape, before_weight, timers)
    if groups.pp_rank == (0 if v_shape else P - 1) and groups.layout.dp_cp > 1:
        with waiting("all-reduce (losses)", groups.dp_cp):
            dist.all_reduce(total, group=groups.dp_cp)
    if v_shape:  # the sums to every pipeline rank: the last stage keeps reporting them (logs, NaN check)
        with waiting("broadcast (losses)", groups.pp):
            dist.broadcast(total, src=groups.pp_ranks[0], group=groups.pp)
    return {name: (total[i], counts[i]) for i, name in enumerate(names)}


def get_forward_backward_func(schedule: str | None = None, per_token_loss: bool = True):
    """The function that runs one iteration's microbatches on this rank:

        forward_backward(model, batches, forward_step, groups, loss_terms, forward_only=False, ...)
            -> {term: (sum, count)}

    It picks the schedule at call time from the pipeline size (groups.pp_size) and the
    number of model chunks (a list or nn.ModuleList of chunks gives V > 1), unless
    `schedule` names one of SCHEDULES. See forward_backward.
    """
    return functools.partial(forward_backward, schedule=schedule, per_token_loss=per_token_loss)
