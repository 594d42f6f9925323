"""ZB-V's two p2p channels are two process groups (groups.pp for activations, groups.pp_grad for
gradients), not two tags of one group: NCCL ignores tags. batch_isend_irecv takes the ops of one
group per call, so every step posts one batch per channel, activations first; gloo runs the same
code. Here the torch p2p calls are recorded (one process, no messages); the exchange on real gloo
groups is tests/distributed/test_zb_v_grad_group.py."""
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from megatron.core.pipeline_parallel import p2p
from megatron.core.pipeline_parallel.actions import Action, Op
from megatron.core.pipeline_parallel.executor import _Rank
from megatron.core.pipeline_parallel.p2p import ACTIVATIONS, GRADIENTS, P2PCommunicator
from megatron.core.pipeline_parallel.zb_v import zb_v

SHAPE = (4, 1, 2)


class _Group:  # a stand-in process group (weak-referenceable, compared by identity)
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


def _groups(pp_rank=0, pp_size=2, grad_group=True):
    pp, pp_grad = _Group("pp"), _Group("pp_grad") if grad_group else None
    p2p._WARMED.update(g for g in (pp, pp_grad) if g is not None)  # no warm-up collective here
    return SimpleNamespace(pp=pp, pp_grad=pp_grad, pp_size=pp_size, pp_rank=pp_rank, pp_ranks=[10, 11][:pp_size],
                           is_first_stage=pp_rank == 0, is_last_stage=pp_rank == pp_size - 1)


@pytest.fixture
def posted(monkeypatch):
    """Every batch_isend_irecv call as [(group, "send"|"recv", global peer, tensor)]; each call must
    hold the ops of one group, as torch requires."""
    calls = []

    def batch(ops):
        assert len({id(op.group) for op in ops}) == 1, f"one batch mixes groups: {[op.group for op in ops]}"
        calls.append([(op.group, "send" if op.op is dist.isend else "recv", op.peer, op.tensor) for op in ops])
        return [SimpleNamespace(wait=lambda: None) for _ in ops]
    monkeypatch.setattr(dist, "P2POp", lambda fn, tensor, peer, group: SimpleNamespace(
        op=fn, tensor=tensor, peer=peer, group=group))
    monkeypatch.setattr(dist, "batch_isend_irecv", batch)
    return calls


def test_channel_groups_are_the_pipeline_group_and_the_gradient_group():
    g = _groups()
    assert p2p.channel_groups(g, False) == [g.pp]
    assert p2p.channel_groups(g, True) == [g.pp, g.pp_grad]
    with pytest.raises(ValueError, match="schedule zb_v"):
        p2p.channel_groups(_groups(grad_group=False), True)


def test_batches_per_channel_keep_order_activations_first():
    ops = [(GRADIENTS, "g0"), (ACTIVATIONS, "a0"), (GRADIENTS, "g1"), (ACTIVATIONS, "a1")]
    assert p2p.batches_per_channel(ops, 2) == [["a0", "a1"], ["g0", "g1"]]
    assert p2p.batches_per_channel([(GRADIENTS, "g0")], 2) == [["g0"]]
    assert p2p.batches_per_channel([(ACTIVATIONS, "a0")], 1) == [["a0"]]


def test_exchange_posts_one_batch_per_group(posted):
    g = _groups()
    comm = P2PCommunicator(g, SHAPE, torch.float32, "cpu", grad_channel=True)
    t = [torch.full(SHAPE, float(i)) for i in range(4)]
    comm.exchange([("send", t[0], 1, GRADIENTS), ("recv", t[1], 1, ACTIVATIONS), ("send", t[2], 1),
                   ("recv", t[3], 1, GRADIENTS)])
    assert [[(grp, kind, peer) for grp, kind, peer, _ in call] for call in posted] == [
        [(g.pp, "recv", 11), (g.pp, "send", 11)], [(g.pp_grad, "send", 11), (g.pp_grad, "recv", 11)]]
    assert posted[1][0][3] is t[0] and posted[0][0][3] is t[1]


def _check_steps(posted, P, rank):
    """Runs rank's zb_v comm steps through _Rank.communicate; -> how many carried both channels."""
    g = _groups(rank, P)
    g.pp_ranks = list(range(100, 100 + P))
    comm = P2PCommunicator(g, SHAPE, torch.float32, "cpu", grad_channel=True)
    r = _Rank([None, None], [], None, g, comm, torch.ones(1), ["lm loss"], False, 1.0, v_shape=True)
    mixed = 0
    for a in zb_v(P, 4, 2, rank):
        if a.kind != "comm":
            continue
        for op in a.ops:  # what the sends take from
            if op.kind == "send_fwd":
                r.outputs[(op.chunk, op.mb)] = torch.zeros(SHAPE, requires_grad=True) * 1
            elif op.kind == "send_bwd":
                r.in_grads[(op.chunk, op.mb)] = torch.zeros(SHAPE)
        before = len(posted)
        r.communicate(a.ops)
        want = [(g.pp_grad if op.kind.endswith("bwd") else g.pp, op.kind[:4], 100 + op.peer) for op in a.ops]
        got = [(grp, kind, peer) for call in posted[before:] for grp, kind, peer, _ in call]
        assert sorted(got, key=repr) == sorted(want, key=repr), a
        used = {w[0] for w in want}  # one batch per group used, activations first
        assert [call[0][0] for call in posted[before:]] == [x for x in (g.pp, g.pp_grad) if x in used], a
        mixed += len(used) == 2
        for held in (r.outputs, r.in_grads, r.out_grads, r.inputs):
            held.clear()
    return mixed


@pytest.mark.parametrize("P", [2, 4])
def test_zb_v_steps_send_gradients_on_the_gradient_group_and_activations_on_the_pipeline_group(posted, P):
    """Every comm step of a zb_v action list on every rank, through the executor: each batch is
    one group's, every gradient (send_bwd / recv_bwd) on groups.pp_grad, every activation on
    groups.pp, and nothing else is posted."""
    assert sum(_check_steps(posted, P, rank) for rank in range(P)), "no zb_v step carries both channels"


def test_other_schedules_use_the_pipeline_group_only(posted):
    g = _groups(grad_group=False)
    comm = P2PCommunicator(g, SHAPE, torch.float32, "cpu")
    r = _Rank([None], [], None, g, comm, torch.ones(1), ["lm loss"], False, 1.0)
    r.in_grads[(0, 0)] = torch.zeros(SHAPE)
    r.communicate(Action("comm", ops=(Op("send_bwd", 0, 0, 1), Op("recv_fwd", 0, 1, 1))).ops)
    assert [[(grp, kind) for grp, kind, _, _ in call] for call in posted] == [[(g.pp, "send"), (g.pp, "recv")]]
