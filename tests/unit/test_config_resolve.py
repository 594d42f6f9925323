"""The configuration is resolved once (every derived value filled), then validated by checks that
assign nothing; sizes are checked before anything divides by them."""
import dataclasses
import types

import pytest
import torch

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.errors import MegatronUserError
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.data.embedded import EMBEDDED, RECIPE

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "200", "--lr", "1e-3"]


def _resolved(args, world_size=1):
    model_cfg, train_cfg = parse_args(MOCK + args)
    calls = []

    def make_tokenizer(cfg):
        calls.append(cfg.tokenizer_type)
        return types.SimpleNamespace(vocab_size=cfg.null_vocab_size + 1)  # NullTokenizer: N ids + eod

    resolve(model_cfg, train_cfg, world_size, make_tokenizer)
    assert calls == ["NullTokenizer"]  # the tokenizer type is resolved before it is built, once
    return model_cfg, train_cfg


def _snapshot(*cfgs):
    return [dataclasses.asdict(c) for c in cfgs]


def test_resolve_fills_every_derived_value():
    model_cfg, train_cfg = _resolved(["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                                      "1", "--recompute-granularity", "full", "--bf16", "--global-batch-size", "8"], 4)
    assert train_cfg.tokenizer_type == "NullTokenizer"
    assert model_cfg.vocab_size == 101 and model_cfg.padded_vocab_size == 128  # the tokenizer's vocabulary, padded
    assert train_cfg.null_vocab_size == 100  # --vocab-size keeps its own meaning (NullTokenizer's N)
    assert model_cfg.params_dtype == torch.bfloat16
    assert model_cfg.virtual_pipeline_model_parallel_size == 2  # 4 layers / PP 2 / 1 layer per chunk
    assert (model_cfg.recompute_method, model_cfg.recompute_num_layers) == ("uniform", 1)
    assert (model_cfg.ffn_hidden_size, model_cfg.kv_channels, model_cfg.num_query_groups,
            model_cfg.max_position_embeddings) == (128, 8, 4, 16)


@pytest.mark.parametrize("world_size, dp", [(1, 1), (2, 2), (8, 4)])
def test_default_global_batch_is_micro_times_dp(world_size, dp):
    args = ["--tensor-model-parallel-size", "2"] if world_size == 8 else []
    model_cfg, train_cfg = _resolved(args, world_size)
    assert train_cfg.global_batch_size == 2 * dp
    assert validate(model_cfg, train_cfg, world_size).dp == dp  # what the help promises is accepted


def test_validate_assigns_nothing():
    model_cfg, train_cfg = _resolved(["--recompute-granularity", "full", "--fp16"], 2)
    before = _snapshot(model_cfg, train_cfg)
    validate(model_cfg, train_cfg, 2)
    assert _snapshot(model_cfg, train_cfg) == before
    unresolved = TransformerConfig(num_layers=8, pipeline_model_parallel_size=2,
                                   num_layers_per_virtual_pipeline_stage=2, recompute_granularity="full")
    before = _snapshot(unresolved)
    unresolved.validate()
    assert _snapshot(unresolved) == before
    unresolved.resolve()
    assert unresolved.virtual_pipeline_model_parallel_size == 2 and unresolved.recompute_method == "uniform"


def test_resolving_twice_changes_nothing():
    model_cfg, train_cfg = _resolved(["--num-layers-per-virtual-pipeline-stage", "2", "--pipeline-model-parallel-size",
                                      "2", "--global-batch-size", "4"], 2)
    before = _snapshot(model_cfg, train_cfg)
    model_cfg.resolve()
    train_cfg.resolve(1)
    assert _snapshot(model_cfg, train_cfg) == before


@pytest.mark.parametrize("flag, value", [
    ("--tensor-model-parallel-size", "0"), ("--pipeline-model-parallel-size", "-1"),
    ("--num-attention-heads", "0"), ("--hidden-size", "0"), ("--num-layers", "0"), ("--seq-length", "0"),
    ("--kv-channels", "0"), ("--kv-channels", "-4"), ("--ffn-hidden-size", "0"),
    ("--max-position-embeddings", "0"), ("--make-vocab-size-divisible-by", "0"),
    ("--num-layers-per-virtual-pipeline-stage", "0"), ("--num-virtual-stages-per-pipeline-rank", "0"),
    ("--global-batch-size", "0"), ("--global-batch-size", "-8"), ("--micro-batch-size", "0"),
])
def test_zero_or_negative_sizes_are_a_config_error(flag, value):
    model_cfg, train_cfg = parse_args(MOCK + [flag, value])
    with pytest.raises(ConfigError, match=f"^{flag} must be") as info:
        resolve(model_cfg, train_cfg, 2, lambda cfg: types.SimpleNamespace(vocab_size=101))
        validate(model_cfg, train_cfg, 2)
    assert value in str(info.value)


def test_zero_query_groups_is_a_config_error():
    model_cfg, train_cfg = parse_args(MOCK + ["--group-query-attention", "--num-query-groups", "0"])
    with pytest.raises(ConfigError, match="^--num-query-groups must be a positive integer, got 0"):
        resolve(model_cfg, train_cfg, 1)


def test_every_user_error_shares_one_base():
    from megatron.core.checkpointing import CheckpointError
    from megatron.core.datasets import DatasetError
    from megatron.core.parallel_state import ParallelConfigError
    from megatron.core.pipeline_parallel.schedules import ScheduleError
    from megatron.training.data.preprocess import MalformedLine
    from megatron.training.tokenizer import TokenizerError
    for cls in (ConfigError, ParallelConfigError, DatasetError, TokenizerError, CheckpointError, ScheduleError,
                MalformedLine):
        assert issubclass(cls, MegatronUserError), cls


def test_the_embedded_recipe_pins_its_settings():
    # the no-argument run's settings (the CLI defaults when the recipe was written), spelled out so
    # that a change of the defaults does not change `python pretrain_gpt.py`
    model_cfg, train_cfg, _ = parse_args(RECIPE, extra=[EMBEDDED])
    expected = dict(num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=256, hidden_dropout=0.1,
                    attention_dropout=0.1, init_method_std=0.02, micro_batch_size=8, train_iters=200, lr=1e-3,
                    min_lr=1e-4, lr_decay_style="cosine", lr_warmup_iters=20, weight_decay=0.1, clip_grad=1.0,
                    adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, seed=1234, log_interval=10, eval_interval=100,
                    eval_iters=10, split="969,30,1")
    got = {**dataclasses.asdict(model_cfg), **dataclasses.asdict(train_cfg)}
    assert {k: got[k] for k in expected} == expected
