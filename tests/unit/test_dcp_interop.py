"""tools/checkpoint/convert.py --saver torch_dcp / --loader torch_dcp: a sharded checkpoint of ours
(TP 2 x PP 2 x DP 2, vocabulary padding, distributed-optimizer ranges) -> a torch DCP checkpoint that
torch.distributed.checkpoint alone loads (a fresh interpreter without this project) -> ours, bit-exact."""
import json
import os
import subprocess
import sys

import torch

from megatron.core.checkpointing import CheckpointReader, find_checkpoint
from megatron.core.checkpointing import scale_sim as sim

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "checkpoint"))
import convert  # noqa: E402

# torch only: the metadata says each tensor's size and dtype; dcp.load fills them
TORCH_ONLY = """
import json, sys, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
reader = dcp.FileSystemReader(sys.argv[1])
meta = reader.read_metadata().state_dict_metadata
state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
         if isinstance(m, TensorStorageMetadata)}
dcp.load(state, storage_reader=reader)
torch.save(state, sys.argv[2])
print(json.dumps(sorted(k for k in meta if k not in state)))
"""


def test_ours_to_dcp_to_ours_is_bit_exact(tmp_path):
    tensors = sim.gpt_tensors(2, 16, 1000, seq=64, vocab_multiple=8)
    sim.save(str(tmp_path / "ours"), tensors, 2, sim.Layout.of(2, 2, 2))
    ours = CheckpointReader(find_checkpoint(str(tmp_path / "ours")))
    assert convert.main(["--loader", "megatron", "--saver", "torch_dcp", "--load-dir", str(tmp_path / "ours"),
                         "--save-dir", str(tmp_path / "dcp")]) == 0

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", TORCH_ONLY, str(tmp_path / "dcp"), str(tmp_path / "plain.pt")],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["megatron_args"]  # the only non-tensor entry
    plain = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert sorted(plain) == ours.keys()
    for k in plain:
        assert torch.equal(plain[k], ours.global_tensor(k)), k

    assert convert.main(["--loader", "torch_dcp", "--saver", "megatron", "--load-dir", str(tmp_path / "dcp"),
                         "--save-dir", str(tmp_path / "back")]) == 0
    back = CheckpointReader(find_checkpoint(str(tmp_path / "back")))
    assert back.keys() == ours.keys()
    for k in ours:
        assert torch.equal(back.global_tensor(k), ours.global_tensor(k)), k
    assert back.metadata["args"]["model"]["num_layers"] == 2


def test_not_a_dcp_directory_is_one_line_exit_2(tmp_path, capsys):
    assert convert.main(["--loader", "torch_dcp", "--saver", "megatron", "--load-dir", str(tmp_path),
                         "--save-dir", str(tmp_path / "out")]) == 2
    assert "not a torch.distributed.checkpoint directory" in capsys.readouterr().err
