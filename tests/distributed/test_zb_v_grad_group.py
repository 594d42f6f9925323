"""groups.pp_grad on real gloo processes: the same ranks as groups.pp, another group, and a message on
it never meets one on groups.pp (no tags: the channel is the group, as NCCL needs)."""
import torch
import torch.distributed as dist

from megatron.core.pipeline_parallel.p2p import ACTIVATIONS, GRADIENTS, P2PCommunicator
from tests.harness import spawn

SHAPE = (2, 1, 3)


def _crossed_messages(groups):
    """Pipeline rank 0 sends an activation, then a gradient; rank 1 receives the gradient first.
    On one ordered channel the first receive would get the activation."""
    ranks = (dist.get_process_group_ranks(groups.pp), dist.get_process_group_ranks(groups.pp_grad))
    comm = P2PCommunicator(groups, SHAPE, torch.float32, "cpu", grad_channel=True)
    peer = 1 - groups.pp_rank
    if groups.pp_rank == 0:
        sends = []
        comm.exchange([("send", torch.full(SHAPE, 1.0), peer, ACTIVATIONS)], sends)
        comm.exchange([("send", torch.full(SHAPE, 2.0), peer, GRADIENTS)], sends)
        for req, _ in sends:
            req.wait()
        got = None
    else:
        grad, act = comm.buffer(), comm.buffer()
        comm.exchange([("recv", grad, peer, GRADIENTS)])
        comm.exchange([("recv", act, peer, ACTIVATIONS)])
        got = (grad.unique().tolist(), act.unique().tolist())
    return ranks, groups.pp_grad is not groups.pp, got


def test_gradient_group_has_the_pipeline_ranks_and_keeps_its_messages_apart():
    results = spawn(4, _crossed_messages, pp=2, schedule="zb_v", timeout=60)  # DP2 x PP2: pipelines [0, 2] and [1, 3]
    for rank, (ranks, distinct, got) in enumerate(results):
        assert ranks[0] == ranks[1] == [rank % 2, rank % 2 + 2] and distinct
        assert got == (None if rank < 2 else ([2.0], [1.0]))
