"""The observability flags through the CLI (issue 31): TensorBoard scalars per iteration (equal to the
run's full-precision metrics), the timers, memory and validation perplexity in the event files, a
torch.profiler trace, W&B offline files; and --log-params-norm / --log-num-zeros-in-grad equal in
every layout to one process's, per iteration."""
import gzip
import json
import math
import os

import numpy as np
import pytest

from megatron.core.timers import LEVEL_NAMES

from .cli import run_metrics
from .test_moe_parity import EP2, MOE
from .test_parity import BASE, FIRST_TOL, RUN_TOL

ITERS = 4
TINY = BASE + ["--train-iters", str(ITERS), "--log-interval", "2", "--eval-interval", "3"]
STATS = ["--log-params-norm", "--log-num-zeros-in-grad"]
# For the layouts' zero counts: no linear biases, since the key bias's gradient is zero in exact arithmetic
# (softmax ignores a shift shared by all keys), so its float value is rounding left over, exactly 0 in
# some summation orders and not in others; untied tables, so that the input embedding's rows of tokens
# absent from the batch are zeros too. Every zero left is structural: the same in every layout.
ZERO_MODEL = ("--disable-bias-linear", "--untie-embeddings-and-output-weights")


def scalars(tb_dir):
    """{tag: {step: value}} of the TensorBoard event files in tb_dir."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_tensorboard_has_every_iteration_timers_memory_ppl_and_the_profiler_writes_a_trace(tmp_path):
    tb = tmp_path / "tb"
    proc, metrics = run_metrics(TINY + STATS + [
        "--tensorboard-dir", str(tb), "--log-throughput", "--timing-log-level", "2", "--log-timers-to-tensorboard",
        "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard",
        "--profile", "--use-pytorch-profiler", "--profile-step-start", "2", "--profile-step-end", "4"])
    train, out = metrics["train"], proc.stdout
    assert sorted(train) == [1, 2, 3, 4]
    # the iteration line as Megatron-LM's, and the timers' report after it
    assert out.count("throughput per GPU (TFLOP/s/GPU): ") == 2
    assert f"num zeros: {train[4]['num_zeros']} | params norm: {train[4]['params_norm']:.3f} |" in out
    assert out.count("(min, max) time across ranks (ms):") == 2
    assert "    forward-backward ......" in out and "    batch-generator ......" in out

    got = scalars(tb)
    f32 = np.float32  # TensorBoard keeps float32: each value is the run's own, rounded once
    for tag, key in (("grad-norm", "grad_norm"), ("params-norm", "params_norm"), ("num-zeros", "num_zeros"),
                     ("learning-rate", "lr")):
        assert got[tag] == {it: f32(train[it][key]) for it in train}, tag  # every iteration (interval 1)
    assert got["lm loss"] == {it: f32(train[it]["losses"]["lm loss"]) for it in train}
    assert got["lm loss vs samples"] == {train[it]["consumed_samples"]: f32(train[it]["losses"]["lm loss"])
                                         for it in train}
    assert set(got["loss-scale"].values()) == {1.0} and set(got["batch-size"].values()) == {8.0}
    assert sorted(got["mem-host-rss-bytes"]) == [1, 2, 3, 4] and min(got["mem-host-rss-bytes"].values()) > 2**20
    # during training (iteration 3) and on the validation set after it (at 4)
    valid = {3: metrics["validation"][3], 4: metrics["validation_set"][4]}
    assert got["lm loss validation ppl"] == {it: f32(math.exp(v["losses"]["lm loss"])) for it, v in valid.items()}
    one_process = [n for n in LEVEL_NAMES[1] + LEVEL_NAMES[2]
                   if n not in ("params-all-gather", "optimizer-unscale-and-check-inf") and "send" not in n
                   and "recv" not in n]  # no distributed optimizer, fp16 or pipeline here
    for name in one_process + ["iteration", "throughput"]:
        assert sorted(got[f"{name}-time" if name != "throughput" else name]) == [2, 4], name
    assert got["forward-backward-time"][4] >= got["forward-compute-time"][4]

    trace = tmp_path / "torch_profile" / "rank-0.json.gz"  # beside the TensorBoard folder, as Megatron-LM's
    with gzip.open(trace) as f:
        events = json.load(f)["traceEvents"]
    steps = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # iterations start .. end - 1
    assert any(e.get("name") == "aten::mm" for e in events)


def _wandb_history(save_dir):
    """{step: {name: value}} of the run W&B wrote offline under save_dir, read from its .wandb file
    (a log of protobuf Records in 32 KiB blocks of 7-byte-headed chunks, after a 7-byte file header)."""
    import glob
    import struct

    from wandb.proto import wandb_internal_pb2 as pb
    [path] = glob.glob(os.path.join(save_dir, "wandb", "offline-run-*", "run-*.wandb"))
    data, pos, block, record, history, run = open(path, "rb").read(), 7, 32768, b"", {}, None
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        record, pos = record + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            r = pb.Record()
            r.ParseFromString(record)
            record = b""
            if r.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                history[r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
            elif r.WhichOneof("record_type") == "run":
                run = r.run
    return history, run


def test_wandb_offline_gets_the_tensorboard_scalars(tmp_path):
    pytest.importorskip("wandb", reason="W&B is an optional extra: pip install -e '.[wandb]'")
    tb, save = tmp_path / "tb", tmp_path / "wandb-files"
    proc, metrics = run_metrics(TINY + STATS + ["--tensorboard-dir", str(tb), "--wandb-project", "megatron-3d-test",
                                                "--wandb-exp-name", "observe", "--wandb-save-dir", str(save)],
                                env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    history, run = _wandb_history(save)
    assert run.project == "megatron-3d-test" and run.display_name == "observe"
    tensorboard = scalars(tb)
    assert "lm loss validation ppl" not in tensorboard  # without --log-validation-ppl-to-tensorboard
    assert sorted(history) == [1, 2, 3, 4]
    for step, logged in history.items():  # every TensorBoard scalar of the step, but its "vs samples" copies
        want = {tag: v[step] for tag, v in tensorboard.items() if step in v and not tag.endswith(" vs samples")}
        assert set(logged) == set(want), step
        assert all(np.float32(logged[tag]) == want[tag] for tag in want), step
    assert history[4]["params-norm"] == metrics["train"][4]["params_norm"]  # W&B keeps full precision


REFERENCE = {}


def _reference(model=ZERO_MODEL):
    if model not in REFERENCE:
        REFERENCE[model] = run_metrics(TINY + STATS + list(model))[1]["train"]
    return REFERENCE[model]


LAYOUTS = {  # name: (ranks, flags, model flags the reference shares)
    "tp2xpp2xdp2-zero1-timers": (8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                     "--use-distributed-optimizer", "--timing-log-level", "2",
                                     "--timing-log-option", "all"], ZERO_MODEL),
    "tp2xdp2-zero3-sp": (4, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                             "--data-parallel-sharding-strategy", "optim_grads_params"], ZERO_MODEL),
    "pp2xdp2-zero2": (4, ["--pipeline-model-parallel-size", "2", "--data-parallel-sharding-strategy",
                          "optim_grads"], ZERO_MODEL),
    "ep2-moe": (2, EP2, ZERO_MODEL + tuple(MOE)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_params_norm_and_zeros_match_one_process(name):
    nproc, flags, model = LAYOUTS[name]
    ref = _reference(model)
    proc, got = run_metrics(TINY + STATS + list(model) + flags, nproc=nproc)
    got = got["train"]
    assert sorted(got) == sorted(ref) == list(range(1, ITERS + 1))
    # a zero is a zero in every layout (padded vocabulary rows, tokens not in the batch): exactly equal
    assert [got[it]["num_zeros"] for it in got] == [ref[it]["num_zeros"] for it in ref]
    rel = {it: abs(got[it]["params_norm"] / ref[it]["params_norm"] - 1) for it in ref}
    print(f"{name}: num zeros {[ref[it]['num_zeros'] for it in ref]}, params norm relative differences {rel}")
    assert rel[1] <= FIRST_TOL and max(rel.values()) <= RUN_TOL
    if "timers" in name:  # --timing-log-option all: each rank's time; the pipeline's messages timed too
        assert "times across ranks (ms):" in proc.stdout and "     rank  7: " in proc.stdout
        assert "  forward-send-backward-recv:" in proc.stdout and "  params-all-gather:" in proc.stdout
