"""Megatron-LM's defaults and the flags its recipes use (issue 14): each flag parses, is checked, and does
what Megatron-LM does with it."""
import dataclasses
import types
from unittest import mock

import pytest
import torch

from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.fusions import attention as attention_front
from megatron.core.fusions import check_config
from megatron.core.transformer.rope import apply_rope, rope_cos_sin
from megatron.training.config.arguments import parse_args
from megatron.training.config.resolve import resolve, validate
from megatron.training.data.embedded import EMBEDDED, RECIPE

MOCK = ["--mock-data", "--vocab-size", "100", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2"]
LEN = ["--train-iters", "10", "--lr", "1e-3"]

# Megatron-LM's defaults (megatron/training/config/training_config/training_config.py, common_config.py, arguments.py,
# transformer_config.py); model sizes, micro batch and sequence length have none there (see README.md)
MEGATRON = dict(lr_decay_style="linear", weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8,
                lr_warmup_iters=0, lr_warmup_samples=0, lr_warmup_init=0.0, min_lr=0.0,
                lr_wsd_decay_style="exponential", eval_iters=100, eval_interval=None, log_interval=100, lr=None,
                clip_grad=1.0, seed=1234,
                save_interval=None, train_iters=None, train_samples=None, global_batch_size=None, hidden_dropout=0.1,
                attention_dropout=0.1, init_method_std=0.02, make_vocab_size_divisible_by=128, rotary_base=10000,
                rotary_percent=1.0, attention_backend="auto", attention_softmax_in_fp32=False,
                distributed_timeout_minutes=10, exit_duration_in_mins=None, inference_max_seq_length=2560,
                initial_loss_scale=2.0 ** 32, min_loss_scale=1.0, loss_scale_window=1000, hysteresis=2,
                exit_interval=None, norm_epsilon=1e-5, position_embedding_type="learned_absolute",
                # --optimizer and Muon's (arguments.py _add_regularization_args)
                optimizer="adam", sgd_momentum=0.9, muon_momentum=0.9, muon_split_qkv=True, muon_nesterov=False,
                muon_scale_mode="spectral", muon_fp32_matmul_prec="medium", muon_coefficient_type="quintic",
                muon_num_ns_steps=5, muon_tp_mode="duplicated", muon_extra_scale_factor=1.0,
                muon_scalar_optimizer="adam")


def _cfgs(args):
    model_cfg, train_cfg = parse_args(MOCK + args)
    resolve(model_cfg, train_cfg, 1, lambda c: types.SimpleNamespace(vocab_size=c.null_vocab_size + 1))
    validate(model_cfg, train_cfg, 1)
    return model_cfg, train_cfg


def _error(args, match):
    with pytest.raises(ConfigError, match=match):
        _cfgs(args)


def test_defaults_are_megatron_lms():
    model_cfg, train_cfg = parse_args([])
    got = {**dataclasses.asdict(model_cfg), **dataclasses.asdict(train_cfg)}
    assert {k: got[k] for k in MEGATRON} == MEGATRON


def test_dist_muon_is_muon_with_the_distributed_optimizer():
    _, t = _cfgs(LEN + ["--optimizer", "dist_muon", "--muon-no-split-qkv"])
    assert (t.optimizer, t.use_distributed_optimizer, t.data_parallel_sharding_strategy) == ("muon", True, "optim")
    assert not t.muon_config().split_qkv


def test_the_embedded_recipe_keeps_its_own_settings():
    _, t, _ = parse_args(RECIPE, extra=[EMBEDDED])
    got = (t.lr, t.min_lr, t.lr_decay_style, t.lr_wsd_decay_style, t.lr_warmup_iters, t.weight_decay, t.adam_beta2,
           t.log_interval, t.eval_interval, t.eval_iters)
    assert got == (1e-3, 1e-4, "cosine", "linear", 20, 0.1, 0.95, 10, 100, 10)


def test_lr_and_length_are_required():
    _error(["--train-iters", "10"], r"^--lr is required")
    _error(["--lr", "1e-3"], r"^give the training length: --train-iters N or --train-samples N$")


@pytest.mark.parametrize("extra,match", [
    (["--train-iters", "5", "--train-samples", "80"], "not both"),
    (["--train-iters", "5", "--lr-decay-samples", "80"], r"--lr-decay-samples do not fit .*--train-iters"),
    (["--train-iters", "5", "--lr-warmup-samples", "8"], "--lr-warmup-samples do not fit"),
    (["--train-samples", "80", "--lr-decay-iters", "5"], r"--lr-decay-iters do not fit .*--train-samples"),
    (["--train-samples", "80", "--lr-warmup-iters", "2"], "--lr-warmup-iters do not fit"),
    (["--train-iters", "5", "--lr-warmup-iters", "2", "--lr-warmup-fraction", "0.1"], "--lr-warmup-fraction or"),
    (["--train-samples", "80", "--lr-warmup-samples", "2", "--lr-warmup-fraction", "0.1"], "--lr-warmup-fraction or"),
    (["--train-samples", "1"], "less than one global batch"),
    (["--train-iters", "5", "--lr-warmup-init", "1.0"], "--lr-warmup-init"),
])
def test_schedule_flags_checked_as_megatron(extra, match):
    _error(["--lr", "1e-3"] + extra, match)


def test_sample_based_training_sets_iterations():
    _, t = _cfgs(["--lr", "1e-3", "--train-samples", "21", "--lr-warmup-samples", "4"])
    assert t.train_iters == 10  # 21 // (micro batch 2 x DP 1)


def test_mcore_flag_is_accepted_and_changes_nothing():
    assert _cfgs(LEN + ["--use-mcore-models"])[0] == _cfgs(LEN)[0]


@pytest.mark.parametrize("flag,value", [("--distributed-timeout-minutes", "0"), ("--inference-max-seq-length", "0"),
                                        ("--exit-duration-in-mins", "0"), ("--rotary-percent", "0"),
                                        ("--rotary-percent", "1.5")])
def test_bad_values_are_one_line_errors(flag, value):
    with pytest.raises(ConfigError, match=flag) as e:
        _cfgs(LEN + [flag, value])
    assert "\n" not in str(e.value)


def test_distributed_timeout_reaches_init_process_group(monkeypatch):
    from megatron.training.loop import initialize
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    _, t = _cfgs(LEN + ["--distributed-timeout-minutes", "3"])
    with mock.patch.object(initialize.dist, "is_initialized", return_value=False), \
            mock.patch.object(initialize.dist, "init_process_group", side_effect=RuntimeError("stop")) as init, \
            pytest.raises(RuntimeError, match="stop"):
        initialize.initialize_distributed(types.SimpleNamespace(), t)
    # the watchdog fires at 3 minutes; the group's own timeout is its backstop, 5% later (core/watchdog.py)
    assert init.call_args.kwargs["timeout"].total_seconds() == 1.05 * 180


def test_partial_rotary_rotates_only_the_leading_dims():
    cfg = TransformerConfig(hidden_size=32, num_attention_heads=2, position_embedding_type="rope", rotary_percent=0.5)
    assert cfg.rotary_dim == 8
    x = torch.randn(5, 2, 2, 16, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(5, cfg.rotary_dim, 10000, "cpu")
    y = apply_rope(x, cos, sin)
    assert torch.equal(y[..., 8:], x[..., 8:])
    assert torch.allclose(y[..., :8], apply_rope(x[..., :8], cos, sin))
    assert not torch.allclose(y[1:, ..., :8], x[1:, ..., :8])
    _error(LEN + ["--position-embedding-type", "rope", "--rotary-percent", "0.1"], "even and at least 2")


def test_megatron_attention_backend_names():
    assert attention_front.select("local", "cpu", torch.float32) == "unfused"
    # fused is Transformer Engine's fused attention; without TE, torch SDPA's cuDNN backend (plain SDPA on CPU)
    te = attention_front.available("te", "cuda", torch.bfloat16)[0]
    assert attention_front.select("fused", "cuda", torch.bfloat16) == ("te" if te else "cudnn")
    assert attention_front.select("fused", "cpu", torch.float32) == "sdpa"
    assert attention_front.select("unfused", "cpu", torch.float32) == "unfused"
    assert _cfgs(LEN + ["--attention-backend", "local"])[0].attention_backend == "local"


def test_transformer_engine_impl_refused_without_it():
    model_cfg, _ = _cfgs(LEN + ["--transformer-impl", "local"])
    model_cfg.transformer_impl = "transformer_engine"
    ok, _ = attention_front.available("te", "cuda" if torch.cuda.is_available() else "cpu", torch.float32)
    if ok:
        pytest.skip("Transformer Engine runs here")
    with pytest.raises(ConfigError, match=r"^--transformer-impl transformer_engine: .*--transformer-impl local"):
        check_config(model_cfg)


def test_softmax_in_fp32_runs_the_half_precision_softmax_in_fp32(monkeypatch):
    seen = []
    real = attention_front.softmax_front.scaled_upper_triang_masked_softmax

    def spy(x, scale, impl):
        seen.append(x.dtype)
        return real(x, scale, impl)

    monkeypatch.setattr(attention_front.softmax_front, "scaled_upper_triang_masked_softmax", spy)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 1, 2, 8, generator=g).to(torch.bfloat16) for _ in range(3))
    out = attention_front.unfused(q, k, v, None, 0.0, 0.35, "torch", softmax_in_fp32=True)
    attention_front.unfused(q, k, v, None, 0.0, 0.35, "torch")
    attention_front.unfused(q.float(), k.float(), v.float(), None, 0.0, 0.35, "torch", softmax_in_fp32=True)
    assert out.dtype == torch.bfloat16
    assert seen == [torch.float32, torch.bfloat16, torch.float32]


def test_llama2_tokenizer_puts_bos_first(tmp_path):
    from megatron.training.tokenizer import build_tokenizer, train_sentencepiece
    docs = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n"] * 50
    model = train_sentencepiece(docs, str(tmp_path / "sp"), 300, num_threads=1)
    cfg = types.SimpleNamespace(tokenizer_type="Llama2Tokenizer", tokenizer_model=model, vocab_file=None,
                                merge_file=None, null_vocab_size=None)
    tok = build_tokenizer(cfg)
    plain = build_tokenizer(types.SimpleNamespace(**{**vars(cfg), "tokenizer_type": "SentencePieceTokenizer"}))
    ids = tok.tokenize("return x")
    assert ids[0] == tok.sp.bos_id() == 1 and ids[1:] == plain.tokenize("return x")
    assert tok.eod == plain.eod == 2 and tok.vocab_size == plain.vocab_size
