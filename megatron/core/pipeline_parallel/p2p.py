"""Point-to-point between neighbouring pipeline stages: activations forward, grads backward.

Every message between stages has the same shape, known before the first microbatch
([s / TP with sequence parallelism, else s, micro batch, hidden]), so receive buffers are
allocated up front and no shape is ever exchanged. All messages of one schedule step
are posted together with batch_isend_irecv (NCCL runs them as one group; gloo posts them
one by one) and waited for before the step's tensors are used: the schedules are built,
and simulated, for exactly these semantics. ZB-V has two channels (activations, gradients),
each its own process group (groups.pp, groups.pp_grad): one batch per channel, the same code
on gloo and NCCL.
"""
import weakref
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.autograd import Variable

from .. import comm
from ..watchdog import waiting

# pipeline groups that have run a collective: a fact of each group (its NCCL communicator exists), kept here
# rather than as an attribute on torch's group object; weak, so an entry goes with its group
_WARMED = weakref.WeakSet()


ACTIVATIONS, GRADIENTS = 0, 1  # p2p channels: messages meet in order per channel and rank pair


def channel_groups(groups, grad_channel: bool) -> list:
    """The process group of each channel: [groups.pp] or, with grad_channel (ZB-V),
    [groups.pp, groups.pp_grad]: a channel is a group, not a p2p tag, since NCCL ignores tags."""
    if not grad_channel:
        return [groups.pp]
    if groups.pp_grad is None:
        raise ValueError("ZB-V sends its gradients over groups.pp_grad: build the groups from a ParallelLayout "
                         "with schedule zb_v (--pipeline-schedule zb-v)")
    return [groups.pp, groups.pp_grad]


def batches_per_channel(ops: list, channels: int) -> list[list]:
    """ops: (channel, item) pairs -> one list of items per channel that has any, channel
    ACTIVATIONS first, each in the ops' order. batch_isend_irecv takes the ops of one group per
    call (torch checks it on every backend; NCCL runs a call as one group of that communicator),
    and every rank posts its channels in the same order (NCCL: communicators used in one order)."""
    batches = [[] for _ in range(channels)]
    for channel, item in ops:
        batches[channel].append(item)
    return [b for b in batches if b]


class P2PCommunicator:
    """Sends and receives tensors of one shape over this rank's pipeline group (groups.pp) and,
    with grad_channel (ZB-V), its gradient group (groups.pp_grad, same ranks).

    Peers are pipeline ranks (0 .. P-1), turned into global ranks via groups.pp_ranks.
    """

    def __init__(self, groups, shape: Sequence[int], dtype: torch.dtype, device, grad_channel: bool = False):
        self.groups, self.shape, self.dtype, self.device = groups, tuple(shape), dtype, torch.device(device)
        self.channels = channel_groups(groups, grad_channel)
        for group in self.channels:
            if groups.pp_size > 1 and group not in _WARMED:
                # one collective with every rank of the group present, before the first batched
                # p2p: NCCL builds the group's communicator on first use and its batched
                # send/recv must not be that first use (torch.distributed.batch_isend_irecv docs)
                comm.all_reduce_(torch.zeros(1, device=self.device), group)
                _WARMED.add(group)

    def buffer(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=self.device)

    def exchange(self, ops: list[tuple[str, torch.Tensor, int]], unwaited_sends: list | None = None) -> None:
        """ops: (kind, tensor, peer pipeline rank[, channel]), kind "send" or "recv", channel
        ACTIVATIONS (default) or GRADIENTS (its own group, see channel_groups); posted in list
        order, one batch per channel's group (activations first on every rank), and all waited for.
        Receives land in their given tensors. Messages between two ranks meet in order per channel.
        unwaited_sends: the sends' (request, tensor) go there instead of being waited for
        (the caller waits before the step ends; the tensor must live until then)."""
        p2p_ops, peers = [], []
        for kind, tensor, peer, *channel in ops:
            if tuple(tensor.shape) != self.shape or tensor.dtype != self.dtype:
                raise RuntimeError(
                    f"pipeline {kind} of {tuple(tensor.shape)} {tensor.dtype}: every message between stages "
                    f"must be {self.shape} {self.dtype} (fixed sequence length and micro batch size)")
            if kind == "send" and not tensor.is_contiguous():  # NCCL sends contiguous memory only
                tensor = tensor.contiguous()
            fn = dist.isend if kind == "send" else dist.irecv
            ch = channel[0] if channel else ACTIVATIONS
            p2p_ops.append((ch, (kind, dist.P2POp(fn, tensor, self.groups.pp_ranks[peer], self.channels[ch]))))
            peers.append((kind, self.groups.pp_ranks[peer]))
        if p2p_ops:
            with waiting("pipeline send/receive", p2p=peers):  # a frozen neighbour ends this rank, in one line
                posted = [(kind, op, req) for batch in batches_per_channel(p2p_ops, len(self.channels))
                          for (kind, op), req in zip(batch, dist.batch_isend_irecv([op for _, op in batch]))]
                for kind, op, req in posted:
                    if kind == "send" and unwaited_sends is not None:
                        unwaited_sends.append((req, op.tensor))
                    else:
                        req.wait()


def free_output(tensor: torch.Tensor) -> None:
    """Drop a sent output's storage; its autograd node (which backward needs) stays.

    The next stage holds its own copy, and no op of ours saves its own output for backward
    (a stage ends in a residual add), so only the graph is kept: memory per microbatch in
    flight is the saved activations, not also the stage output (Megatron-LM does the same).
    """
    tensor.data = torch.empty((1,), device=tensor.device, dtype=tensor.dtype)


def backward_through(output: torch.Tensor, grad: torch.Tensor) -> None:
    """output.backward(grad) for an output whose storage free_output dropped: calls the
    autograd engine directly, skipping torch.autograd.backward's shape check."""
    Variable._execution_engine.run_backward(
        tensors=(output,), grad_tensors=(grad,), keep_graph=False, create_graph=False, inputs=(),
        allow_unreachable=True, accumulate_grad=True)
