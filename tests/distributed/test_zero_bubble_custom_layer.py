"""A layer written with no knowledge of zero-bubble schedules (plain nn.Linear, nn.LayerNorm, GeLU,
built here) on two gloo pipeline ranks under ZB-H1 and ZB-H2: every parameter's gradient equals the
1F1B run's (the ordinary backward, whose parity with one process test_pipeline_parallel.py shows) bit
for bit, and every post-accumulate-grad hook (DDP's) fires inside a W action, once per microbatch.
The stage input's gradient comes from B (the previous rank waits for it); B computes no weight
gradient (pipeline_parallel/backward_split.py)."""
import time
import types

import torch
import torch.nn.functional as F
from torch import nn

from megatron.core.pipeline_parallel import forward_backward
from tests.harness import spawn

H, S, B, M = 8, 6, 2, 4


class Stage(nn.Module):
    """Norm, MLP with a residual; the first stage reads its input from the batch, the last returns a
    per-token loss [b, s]."""

    def __init__(self, first, last):
        super().__init__()
        self.config = types.SimpleNamespace(hidden_size=H, sequence_parallel=False, params_dtype=torch.float32,
                                            pipeline_v_layout=False)
        self.first, self.last, self.input_tensor = first, last, None
        torch.manual_seed(3 + first)  # nn's init draws from the global generator: seed it per stage
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(H), nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def set_input_tensor(self, tensor):
        self.input_tensor = tensor

    def forward(self, batch):
        x = batch["x"] if self.first else self.input_tensor  # [s, b, h]
        x = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        return (x * batch["target"]).sum(-1).t() if self.last else x


def _step(model, batch):
    out = model(batch)
    return {"lm loss": (out, batch["loss_mask"])} if model.last else out


def _body(groups):
    g = torch.Generator().manual_seed(5)
    batches = [{"tokens": torch.zeros(B, S, dtype=torch.long), "x": torch.randn(S, B, H, generator=g),
                "target": torch.randn(S, B, H, generator=g), "loss_mask": torch.ones(B, S)} for _ in range(M)]
    results = {}
    for schedule in ("1f1b", "zb_h1", "zb_h2"):
        model = Stage(groups.is_first_stage, groups.is_last_stage)
        fired = []
        for n, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, n=n: fired.append((n, time.perf_counter())))
        trace = []
        losses = forward_backward(model, batches, _step, groups, schedule=schedule, trace=trace)
        kinds = [next(k for k, _, _, t0, t1 in trace if t0 <= t <= t1) for _, t in fired]
        results[schedule] = ({n: p.grad for n, p in model.named_parameters()}, losses["lm loss"][0], kinds,
                             {n: sum(f == n for f, _ in fired) for n, _ in model.named_parameters()})
    return results


def test_a_plain_torch_layer_gets_its_weight_gradients_in_w_equal_to_the_ordinary_backward():
    for rank in spawn(2, _body, pp=2, timeout=120):
        want, want_loss, want_kinds, want_calls = rank["1f1b"]
        assert set(want_kinds) == {"B"} and want_calls == dict.fromkeys(want, M)  # 1F1B: the hooks in B
        for schedule in ("zb_h1", "zb_h2"):
            got, loss, kinds, calls = rank[schedule]
            assert set(kinds) == {"W"} and calls == want_calls, (schedule, kinds, calls)
            assert torch.equal(loss, want_loss)
            for n in want:
                assert torch.equal(got[n], want[n]), f"{schedule} {n}: {(got[n] - want[n]).abs().max():.3e}"
