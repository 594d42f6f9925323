"""--yaml-cfg through the real CLI (issue 47): examples/gpt/gpt3_small.yaml is train_gpt3_small.sh (the same
resolved configuration, the same losses and grad norms, bitwise: the same ops in the same order); command-line
flags override the file; a bad file is one line per problem and exit 2 before anything runs."""
import dataclasses
import json
import os
import subprocess

from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve

from .cli import REPO, run_cli

SHELL, YAML = "examples/gpt/train_gpt3_small.sh", "examples/gpt/gpt3_small.yaml"
WORLD = 4  # the recipe's GPUS_PER_NODE


def _shell_flags():
    return subprocess.run(["bash", os.path.join(REPO, SHELL)], env=dict(os.environ, PRINT_ARGS="1"),
                          capture_output=True, text=True, check=True).stdout.splitlines()


def test_yaml_recipe_resolves_to_the_shell_recipe():
    flags, from_yaml = parse_args(_shell_flags()), parse_args(["--yaml-cfg", os.path.join(REPO, YAML)])
    for configs in (flags, from_yaml):
        resolve(*configs, WORLD)
    assert from_yaml[1].yaml_cfg.endswith(YAML)
    from_yaml[1].yaml_cfg = None
    differ = [(f.name, getattr(a, f.name), getattr(b, f.name)) for a, b in zip(flags, from_yaml)
              for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]
    assert not differ


def _train_metrics(args, tmp_path, name):
    """{iteration: its record} from --log-metrics-jsonl (losses, grad norm, lr, loss scale at full precision)."""
    path = tmp_path / f"{name}.jsonl"
    proc = run_cli(list(args) + ["--log-metrics-jsonl", str(path)], pinned=False, timeout=300)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return proc, {r["iteration"]: r for r in records if r["type"] == "train"}


def test_yaml_and_flags_train_the_same_run(tmp_path):
    def small(name):  # one process, three iterations: the same overrides after either form of the recipe
        return ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--train-iters", "3",
                "--global-batch-size", "2", "--vocab-size", "512", "--eval-iters", "0", "--log-interval", "1",
                "--save", str(tmp_path / name / "ck"), "--load", str(tmp_path / name / "ck"),
                "--tensorboard-dir", str(tmp_path / name / "tb")]
    _, flags = _train_metrics(_shell_flags() + small("flags"), tmp_path, "flags")
    # the overrides given before --yaml-cfg: the command line wins wherever it stands
    proc, from_yaml = _train_metrics(small("yaml") + ["--yaml-cfg", YAML], tmp_path, "yaml")
    assert sorted(flags) == [1, 2, 3]
    assert from_yaml == flags  # bitwise
    log = proc.stdout
    assert f"> configuration from --yaml-cfg {YAML} and the command line (differences from defaults):" in log
    assert "    --hidden-size 64\n" in log and "    --train-iters 3\n" in log and "    --fp16\n" in log


def test_bad_yaml_is_one_line_per_problem_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("language_model:\n  num_layers: four\n  hidden_sise: 64\nmock_data: true\n")
    proc = run_cli(["--yaml-cfg", str(bad), "--train-iters", "2"], check=False, pinned=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --yaml-cfg {bad}: language_model.num_layers: expected an integer, got 'four'",
                      f"error: --yaml-cfg {bad}: language_model.hidden_sise: unknown option (no flag --hidden-sise; "
                      "see --help)"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr and "iteration " not in proc.stdout
