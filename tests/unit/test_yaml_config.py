"""--yaml-cfg (issue 47): Megatron-LM's YAML format (nested groups, field names, flag names) becomes the
same configuration as the flags; the override order; every bad key or value is one line naming its path."""
import pytest

from megatron.core.errors import ConfigError
from megatron.training.config.arguments import build_parser, parse_args
from megatron.training.config.yaml_config import config_differences, yaml_cfg_first, yaml_flags
from megatron.training.data.embedded import RECIPE

MODEL = """
language_model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  add_bias_linear: false          # the field's name: false is --disable-bias-linear
  swiglu: true
model_parallel:
  tensor_model_parallel_size: 2
  sequence_parallel: true
lr: 1e-3                          # PyYAML reads this as text: still the number
min_lr: 1.0e-4
data_path: [0.5, a, 0.5, b]
split: 99,1,0
mock_data: false
"""
FLAGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--disable-bias-linear", "--swiglu",
         "--tensor-model-parallel-size", "2", "--sequence-parallel", "--lr", "1e-3", "--min-lr", "1.0e-4",
         "--data-path", "0.5", "a", "0.5", "b", "--split", "99,1,0"]


def _file(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _without_file(configs):
    configs[1].yaml_cfg = None
    return configs


def test_nested_yaml_is_the_same_configuration_as_the_flags(tmp_path):
    path = _file(tmp_path, MODEL)
    assert _without_file(parse_args(["--yaml-cfg", path])) == parse_args(FLAGS)
    assert parse_args([f"--yaml-cfg={path}"])[1].yaml_cfg == path


def test_flag_names_and_hyphens_are_keys_too(tmp_path):
    path = _file(tmp_path, "disable-bias-linear: true\nuntie_embeddings_and_output_weights: true\n"
                 "no_mmap_bin_files: true\nmmap_bin_files: true\n")  # the flag's name, then the field's, differ
    with pytest.raises(ConfigError, match="mmap_bin_files: --no-mmap-bin-files is already set at no_mmap_bin_files"):
        parse_args(["--yaml-cfg", path])
    path = _file(tmp_path, "disable-bias-linear: true\nuntie_embeddings_and_output_weights: true\n")
    model, _ = parse_args(["--yaml-cfg", path])
    assert model.add_bias_linear is False and model.untie_embeddings_and_output_weights is True


def test_command_line_overrides_the_file_wherever_it_stands(tmp_path):
    path = _file(tmp_path, MODEL)
    argv = yaml_cfg_first(["--lr", "5e-4", "--yaml-cfg", path, "--num-layers", "3"])
    model, train = parse_args(argv)
    assert (train.lr, model.num_layers, model.hidden_size, train.min_lr) == (5e-4, 3, 64, 1e-4)
    # the embedded recipe's settings come before the user's flags: the file overrides them
    model, train = parse_args(RECIPE + yaml_cfg_first(["--lr", "5e-4", "--yaml-cfg", path]))
    assert (model.hidden_size, model.num_layers, train.lr, train.train_iters) == (64, 2, 5e-4, 200)
    # in place (a tool's own argv): flags before the file are overridden by it
    assert parse_args(["--num-layers", "3", "--yaml-cfg", path])[0].num_layers == 2


def test_configuration_log_lists_what_differs_from_defaults(tmp_path):
    model, train = parse_args(["--yaml-cfg", _file(tmp_path, MODEL), "--lr", "2e-3"])
    lines = list(config_differences(model, train))
    assert {"--num-layers 2", "--disable-bias-linear", "--lr 0.002", "--data-path 0.5 a 0.5 b"} <= set(lines)
    assert not any(line.startswith("--seed") for line in lines)


BAD = """
language_model:
  num_layer: 2
  hidden_size: 64.5
  swiglu: 1
model_parallel:
  sequence_parallel: yes
  pipeline_model_parallel_size: two
lr_decay_style: cosinus
rampup_batch_size: [1, 2]
micro_batch_size: null
data_path: ${MEGATRON_TEST_UNSET_VARIABLE}/x
"""


def test_every_bad_key_is_one_line_with_its_path(tmp_path, monkeypatch):
    monkeypatch.delenv("MEGATRON_TEST_UNSET_VARIABLE", raising=False)
    path = _file(tmp_path, BAD)
    with pytest.raises(ConfigError) as e:
        parse_args(["--yaml-cfg", path])
    lines = str(e.value).split("\nerror: ")
    expected = ["language_model.num_layer: unknown option (no flag --num-layer",
                "language_model.hidden_size: expected an integer, got 64.5",
                "language_model.swiglu: expected true or false, got 1",
                "model_parallel.pipeline_model_parallel_size: expected an integer, got 'two'",
                "lr_decay_style: 'cosinus' is not one of constant, linear, cosine",
                "rampup_batch_size: expected a list of 3 values, got [1, 2]",
                "micro_batch_size: null is no value of --micro-batch-size",
                "data_path: environment variable MEGATRON_TEST_UNSET_VARIABLE"]
    assert len(lines) == len(expected), lines
    for line, want in zip(lines, expected):
        assert line.startswith(f"--yaml-cfg {path}: {want}"), line


@pytest.mark.parametrize("text,expected", [
    ("num_layers: [2\n", "not valid YAML at line 2"),
    ("- num_layers\n", "expected a mapping of options (key: value), got list"),
    ("yaml_cfg: other.yaml\n", "yaml_cfg: a YAML file cannot name another one"),
])
def test_bad_files_are_one_line(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=None) as e:
        yaml_flags(build_parser(), _file(tmp_path, text))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it .*give an existing YAML file"):
        parse_args(["--yaml-cfg", str(tmp_path / "absent.yaml")])


def test_environment_variables_and_empty_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGATRON_TEST_DATA", "/data/corpus")
    _, train = parse_args(["--yaml-cfg", _file(tmp_path, "data_path: ${MEGATRON_TEST_DATA}_text\n")])
    assert train.data_path == ["/data/corpus_text"]
    _, train = parse_args(["--yaml-cfg", _file(tmp_path, "data_path: 0.3 ${MEGATRON_TEST_DATA} 0.7 b\n")])
    assert train.data_path == ["0.3", "/data/corpus", "0.7", "b"]  # text splits at whitespace, as in a shell
    assert _without_file(parse_args(["--yaml-cfg", _file(tmp_path, "# nothing\n")])) == parse_args([])
