"""bench/gpu_suite.py without a GPU: every command it would run parses with the CLI of the script it
calls (pretrain_gpt.py's parser, bench/overhead.py's), the extra rows run ours with
--cross-entropy-loss-fusion and the default rows without it, and a failing step does not stop the
suite (the next step runs, results.json and the report are written)."""
import json
import os
import shlex
import sys

import pytest

from bench import overhead
from megatron.training.config.arguments import parse_args
from megatron.training.data.embedded import EMBEDDED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))  # the suite imports its report as a sibling module
import gpu_suite  # noqa: E402
import gpu_suite_report  # noqa: E402

CE = "--cross-entropy-loss-fusion"


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    cwd = os.getcwd()
    os.chdir(ROOT)  # the suite runs from the repository root
    try:
        help_text = gpu_suite.help_texts()
        return {name: cmd for name, _, cmd in gpu_suite.steps(str(tmp_path_factory.mktemp("out")), help_text)}
    finally:
        os.chdir(cwd)


def _argv_after(cmd, script):
    words = shlex.split(cmd)
    return words[words.index(next(w for w in words if w.endswith(script))) + 1:]


def test_overhead_commands_parse(commands):
    runs = {n: c for n, c in commands.items() if isinstance(c, str) and ("overhead.py" in c or "moe_plain.py" in c)}
    assert set(runs) == set(gpu_suite_report.OVERHEAD_STEPS)
    for name, cmd in runs.items():
        script = "overhead.py" if "overhead.py" in cmd else "moe_plain.py"
        argv = _argv_after(cmd, script)
        if script == "moe_plain.py":
            argv = ["--preset", "moe-seed004", *argv]  # what bench/moe_plain.py adds
        a = overhead.parse(argv)
        assert a.device == "cuda" and a.dtype == "bf16" and a.no_write, name
        assert a.cross_entropy_loss_fusion == (CE in name), name
        assert not a.no_gradient_accumulation_fusion, name
    assert overhead.parse(_argv_after(runs["gpt1.3b plain compiled"], "overhead.py")).models == ["ours", "compiled"]
    assert overhead.parse(_argv_after(runs["llama1b ours vs plain"], "overhead.py")).shape.arch == "llama"
    prof = overhead.parse(_argv_after(runs[gpu_suite_report.PROFILE_STEP], "overhead.py"))
    assert prof.profile and prof.models == ["ours", "compiled"] and prof.rounds == 1 and prof.steps_per_round == 1


def test_pretrain_commands_parse(commands):
    runs = {n: c for n, c in commands.items() if isinstance(c, str) and "pretrain_gpt.py" in c}
    assert set(runs) == set(gpu_suite_report.PRETRAIN_STEPS)
    for name, cmd in runs.items():
        model_cfg, train_cfg, _ = parse_args(_argv_after(cmd, "pretrain_gpt.py"), extra=[EMBEDDED])
        assert model_cfg.cross_entropy_loss_fusion == (CE in name), name
        assert model_cfg.residual_norm_fusion == ("--residual-norm-fusion" in name), name
        assert model_cfg.gradient_accumulation_fusion and train_cfg.bf16, name


def test_a_failing_step_does_not_stop_the_suite(tmp_path, monkeypatch):
    ran = []

    def fake_steps(out, help_text):
        ran.append(out)
        return [("fails", 30, "echo broken; exit 3"), ("missing", 30, (None, "not here")),
                ("works", 30, 'echo \'RESULT {"name": "x", "ms_per_step": 1.0, "device": "NVIDIA H200"}\'')]
    monkeypatch.setattr(gpu_suite, "steps", fake_steps)
    monkeypatch.setattr(gpu_suite, "help_texts", lambda: {"pretrain": "", "kernels": "", "overhead": ""})
    gpu_suite.main(["--out", str(tmp_path), "--label", "test"])
    done = {d["name"]: d for d in json.loads((tmp_path / "results.json").read_text())}
    assert done["fails"]["rc"] == 3 and done["works"]["rc"] == 0 and done["missing"]["skipped"] == "not here"
    assert done["works"]["results"][0]["ms_per_step"] == 1.0
    assert "| x | 1.0 |" in (tmp_path / "gpu_h200.md").read_text()


def test_profile_tables_reach_the_report(tmp_path):
    """The profile step's torch.profiler tables (what follows each "==== profile" line) go into the report."""
    text = ("| ours | 1 |\nratio (median ms/step) ours / plain (compiled): 1.080\n"
            "\n==== profile: ours (2 steps), sorted by self_cuda_time_total\n----\nName  Self CUDA\n"
            "sm90_gemm  100ms\n\n==== profile: compiled (2 steps), sorted by self_cuda_time_total\ntriton_red  9ms\n")
    done = [{"name": gpu_suite_report.PROFILE_STEP, "rc": 0, "seconds": 1.0, "output": text, "results": []}]
    _, report = gpu_suite_report.render(done, "test", str(tmp_path))
    assert "#### profile: ours (2 steps), sorted by self_cuda_time_total" in report
    assert "    sm90_gemm  100ms" in report and "    triton_red  9ms" in report and "| ours | 1 |" in report


def test_cross_entropy_bench_checks_every_implementation_on_cpu():
    """bench/cross_entropy.py's rows agree with the unfused loss before they are timed (the compiled row through
    inductor's CPU backend here; on a GPU the same check runs the CUDA path the flag uses), and its table reaches
    the report."""
    import cross_entropy
    rows, bandwidth = cross_entropy.run("cpu", tokens=64, vocab=300, repeats=1)
    assert [r["name"] for r in rows] == ["vocab-parallel", "fused, chunked", "fused, compiled"] and bandwidth is None
    for r in rows:  # bf16 logits: losses in fp32 within a few ulps of log(vocab); gradients within a bf16 rounding
        assert r["max_loss_diff"] <= 1e-5 and r["max_grad_diff"] <= 2.0 ** -8 / 64 and r["ms"] > 0
    text = cross_entropy.markdown(rows, "cpu", 64, 300, None)
    done = [{"name": "cross entropy", "rc": 0, "seconds": 1.0, "output": text, "results": []}]
    assert "| fused, compiled |" in gpu_suite_report.render(done, "test", "/nonexistent")[1]
