"""The estimate of activation offload (--cpu-offloading, planner/offload_cost.py): device bytes moved off per
micro-batch in flight, and the PCIe time of their reload, for interleaved PP2 with full recompute (the kept
chunk inputs) and without recompute. tests/distributed/test_activation_offload.py checks the bytes against a
measured block."""
import pytest

from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.planner import make_cluster, memory, predict
from megatron.training.planner.activations import kept_activation_bytes
from megatron.training.planner.predict import PLAN_DEFAULTS

TOY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
       "--max-position-embeddings", "128", "--vocab-size", "512", "--global-batch-size", "16", "--bf16",
       "--micro-batch-size", "2", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]
WORLD = 2


def _configs(*extra):
    c, t = parse_args(PLAN_DEFAULTS + TOY + list(extra))[:2]
    resolve(c, t, WORLD)
    validate(c, t, WORLD)
    return c, t


@pytest.mark.parametrize("recompute", [[], ["--recompute-granularity", "full"]], ids=["none", "full"])
def test_offload_moves_one_layer_per_chunk_off_each_micro_batch_in_flight(recompute):
    c, t = _configs(*recompute)
    c_off, t_off = _configs(*recompute, "--cpu-offloading-num-layers", "1")
    assert t_off.cpu_offloading  # Megatron-LM's mapping: a layer count turns it on
    for stage in range(2):
        plain, off = memory.estimate(c, t, WORLD, stage), memory.estimate(c_off, t_off, WORLD, stage)
        per_chunk = kept_activation_bytes(c, t.micro_batch_size, 1, 1)[0]  # each stage: 2 chunks of 1 layer
        assert off["offloaded"] == 2 * per_chunk > 0 and plain["offloaded"] == 0
        assert plain["activations"] - off["activations"] == off["offloaded"]
        assert memory.total_bytes(plain) - memory.total_bytes(off) == off["in_flight"] * off["offloaded"]


def test_the_reload_is_the_pcie_time_of_every_micro_batch():
    cluster = make_cluster("H100-SXM", WORLD)
    plain = predict(TOY, cluster).step
    off = predict(TOY + ["--cpu-offloading-num-layers", "1"], cluster).step
    c, t = _configs("--cpu-offloading-num-layers", "1")
    moved = max(memory.estimate(c, t, WORLD, s)["offloaded"] for s in range(2))
    micro = 16 // 2
    assert plain.offload == 0 and off.offload == pytest.approx(micro * moved / cluster.pcie_bw)
    assert off.total == pytest.approx(plain.total + off.offload)
    assert cluster.pcie_bw == pytest.approx(64e9 * 0.8)  # calibration.toml: PCIe Gen5 x16, 80% achieved
