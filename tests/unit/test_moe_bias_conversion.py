"""tools/checkpoint/convert.py keeps the MoE routers' expert bias (checkpoint state "buffer"): ours ->
torch_dcp -> ours and ours -> ours bit-exact, the DCP entry under our model's state_dict name; HF
Mixtral has no such tensor, so --saver hf refuses a non-zero bias (one line, exit 2) and drops a zero one."""
import os
import sys

import pytest
import torch

from megatron.core.checkpointing import CheckpointReader, find_checkpoint, save_global_checkpoint, whole_piece
from megatron.core.checkpointing.dcp_interop import load_dcp

transformers = pytest.importorskip("transformers")

from tests.hf_round_trip import REPO  # noqa: E402
from tests.unit.test_mixtral_conversion import tiny_mixtral  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "tools", "checkpoint"))
import convert  # noqa: E402

BIAS = [f"decoder.layers.{i}.mlp.router.expert_bias" for i in (0, 1)]


def _convert(load, saver, save, loader="megatron"):
    return convert.main(["--loader", loader, "--saver", saver, "--load-dir", str(load), "--save-dir", str(save)])


def _ours_with_bias(tmp_path, bias):
    """A Mixtral converted to ours, re-saved with an expert bias [4] per layer (bias(i) for layer i)."""
    tiny_mixtral().save_pretrained(tmp_path / "hf")
    assert _convert(tmp_path / "hf", "megatron", tmp_path / "plain", loader="hf") == 0
    reader = CheckpointReader(find_checkpoint(str(tmp_path / "plain")))
    pieces = [whole_piece(k, "param", reader.global_tensor(k)) for k in reader.keys("param")]
    pieces += [whole_piece(k, "buffer", bias(i)) for i, k in enumerate(BIAS)]
    save_global_checkpoint(str(tmp_path / "ours"), pieces, dict(reader.metadata["args"]))
    return CheckpointReader(find_checkpoint(str(tmp_path / "ours")))


def _same(a, b):
    for state in ("param", "buffer"):
        assert a.keys(state) == b.keys(state), state
        for k in a.keys(state):
            assert torch.equal(a.global_tensor(k, state), b.global_tensor(k, state)), k


def test_expert_bias_survives_ours_dcp_ours_and_ours_ours(tmp_path):
    ours = _ours_with_bias(tmp_path, lambda i: torch.tensor([0.25, -0.5, 0.0, 1.0]) * (i + 1))
    assert ours.keys("buffer") == BIAS
    assert _convert(tmp_path / "ours", "torch_dcp", tmp_path / "dcp") == 0
    args, flat = load_dcp(str(tmp_path / "dcp"))
    assert args["buffer_keys"] == BIAS and torch.equal(flat[BIAS[1]], ours.global_tensor(BIAS[1], "buffer"))
    assert _convert(tmp_path / "dcp", "megatron", tmp_path / "back", loader="torch_dcp") == 0
    _same(ours, CheckpointReader(find_checkpoint(str(tmp_path / "back"))))
    assert _convert(tmp_path / "ours", "megatron", tmp_path / "copy") == 0
    _same(ours, CheckpointReader(find_checkpoint(str(tmp_path / "copy"))))


def test_hf_saver_refuses_a_nonzero_bias_and_drops_a_zero_one(tmp_path, capsys):
    _ours_with_bias(tmp_path, lambda i: torch.full((4,), 0.1 * i))  # layer 0's is zero, layer 1's is not
    assert _convert(tmp_path / "ours", "hf", tmp_path / "hf_out") == 2
    err = [s for s in capsys.readouterr().err.splitlines() if s.startswith("error")]  # not HF's progress bars
    assert len(err) == 1 and err[0].startswith(f"error: {BIAS[1]} (1 such) is non-zero"), err

    (tmp_path / "zero").mkdir()
    _ours_with_bias(tmp_path / "zero", lambda i: torch.zeros(4))
    assert _convert(tmp_path / "zero" / "ours", "hf", tmp_path / "hf_zero") == 0
    back = transformers.MixtralForCausalLM.from_pretrained(tmp_path / "hf_zero").state_dict()
    want = transformers.MixtralForCausalLM.from_pretrained(tmp_path / "zero" / "hf").state_dict()
    assert back.keys() == want.keys() and all(torch.equal(back[k], want[k]) for k in want)
