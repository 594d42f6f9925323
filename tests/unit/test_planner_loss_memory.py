"""The memory estimate's cross-entropy term (planner/activations.loss_bytes): what autograd keeps for the loss's
backward, measured with saved-tensor hooks, for the vocab-parallel cross entropy (its fp32 softmax) and the fused
one (the logits); only the last pipeline stage holds it, once per loss (multi-token prediction adds one each)."""
import pytest
import torch

from megatron.core.comm import PlanGroup
from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from megatron.core.tensor_parallel.cross_entropy_fused import fused_vocab_parallel_cross_entropy
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve
from megatron.training.planner.activations import loss_bytes
from megatron.training.planner.memory import estimate
from megatron.training.planner.predict import PLAN_DEFAULTS
from tests.activation_memory import measure

ARGV = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--vocab-size", "1000", "--micro-batch-size", "3",
        "--global-batch-size", "6", "--bf16"]


def _configs(*extra, world=1):
    c, t = parse_args(PLAN_DEFAULTS + ARGV + list(extra))[:2]
    resolve(c, t, world)
    return c, t


@pytest.mark.parametrize("fused", [False, True])
def test_loss_bytes_is_what_autograd_keeps(fused):
    c, t = _configs(*(["--cross-entropy-loss-fusion"] if fused else []))
    s, b, v = c.seq_length, t.micro_batch_size, c.padded_vocab_size
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(v, c.hidden_size, generator=g, dtype=torch.bfloat16, requires_grad=True)
    hidden = torch.randn(s, b, c.hidden_size, generator=g, dtype=torch.bfloat16)
    target = torch.randint(0, c.vocab_size, (s, b), generator=g)
    ce = fused_vocab_parallel_cross_entropy if fused else vocab_parallel_cross_entropy
    with torch.no_grad():
        logits = hidden @ weight.t()  # the output layer's GEMM: its own saved input is the layer's, not the loss's
    logits.requires_grad_()
    loss, saved = measure(lambda: ce(logits * 1, target, c.vocab_size, PlanGroup(1)), [weight, hidden, target])
    loss.sum().backward()
    per_token = 8 * s * b if fused else 0  # fused (the eager path here): the local target ids (int64)
    assert saved == loss_bytes(c, b, 1) + per_token
    assert loss_bytes(c, b, 1) == (2 if fused else 4) * s * b * v


def test_only_the_last_stage_holds_the_loss_once_per_loss():
    c, t = _configs("--pipeline-model-parallel-size", "2", world=2)
    first, last = estimate(c, t, 2, 0), estimate(c, t, 2, 1)
    assert last["activations"] - first["activations"] == loss_bytes(c, t.micro_batch_size, 1)  # same layers each
    c1, t1 = _configs("--mtp-num-layers", "1")
    c0, t0 = _configs()
    extra = estimate(c1, t1, 1)["activations"] - estimate(c0, t0, 1)["activations"]
    mtp_layer = estimate(c0, t0, 1)["activations"] - loss_bytes(c0, t0.micro_batch_size, 1)
    assert extra == mtp_layer / 2 + loss_bytes(c0, t0.micro_batch_size, 1)  # one more layer (of 2) and one loss
