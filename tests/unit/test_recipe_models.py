"""What Megatron-LM's recipe flags do inside the model and the step (issue 31), one process:
--apply-layernorm-1p, --recompute-modules, --moe-router-dtype, several balance losses, --decoupled-lr,
the default per-microbatch loss averaging, --dist-ckpt-strictness and --no-mmap-bin-files."""
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from megatron.core.checkpointing.hf_checks import with_whole_norm_weights
from megatron.core.config import ConfigError, TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import LRScheduler
from megatron.core.optimizer.adam import _adamw
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.pipeline_parallel import forward_backward
from megatron.core.tensor_parallel.initialization import initialize_parameters
from megatron.core.tensor_parallel.param_meta import is_embedding_or_output
from megatron.core.transformer.moe import aux_losses
from megatron.core.transformer.moe.aux_losses import RouterLosses
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.token_dispatcher import weighted_sum
from megatron.training.checkpointing.load_args import check_checkpoint_args

GROUPS = ParallelLayout(1).plan_groups(0)  # one process: every group a stand-in of one rank
SHAPE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8, hidden_dropout=0.0,
             attention_dropout=0.0, normalization="RMSNorm", position_embedding_type="rope", swiglu=True,
             untie_embeddings_and_output_weights=True, make_vocab_size_divisible_by=1)
IDS = torch.tensor([[5, 17, 56, 3, 9, 42, 7, 8], [6, 1, 2, 30, 33, 33, 12, 0]])


def _model(**changes):
    config = TransformerConfig(**{**SHAPE, **changes}).resolve(vocab_size=64)
    model = GPTModel(config, GROUPS, device="cpu")
    initialize_parameters(model, 1234, 0, 1)
    return model


def _loss_and_grads(model):
    model.zero_grad()
    logits = model(IDS)  # [b, s, V]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), IDS.roll(-1, 1).reshape(-1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_layernorm_1p_stores_w_minus_1_and_computes_the_same():
    plain, zero = _model(), _model(layernorm_zero_centered_gamma=True)
    norms = [n for n, _ in plain.named_parameters() if n.endswith("layernorm.weight")]
    assert norms and all(torch.equal(dict(zero.named_parameters())[n], torch.zeros(32)) for n in norms)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # w in [0.5, 2]: w - 1 is exact, and so is (w - 1) + 1
        for n in norms:
            w = 0.75 + 0.5 * torch.rand(32, generator=g)
            dict(plain.named_parameters())[n].copy_(w)
            dict(zero.named_parameters())[n].copy_(w - 1)
    (a, ga), (b, gb) = _loss_and_grads(plain), _loss_and_grads(zero)
    assert torch.equal(a, b) and all(torch.equal(ga[n], gb[n]) for n in ga)
    tensors = {n: p.detach() for n, p in zero.named_parameters()}
    whole = with_whole_norm_weights({"layernorm_zero_centered_gamma": True}, tensors)  # what HF gets
    assert all(torch.equal(whole[n], dict(plain.named_parameters())[n]) for n in norms)
    assert whole["output_layer.weight"] is tensors["output_layer.weight"]


def test_a_checkpoint_saved_without_1p_does_not_load_into_a_1p_model(monkeypatch):
    from megatron.training.checkpointing import load_args as checkpoint_args
    monkeypatch.setattr(checkpoint_args, "_saved_model_args", lambda path: {"num_layers": 2})  # older checkpoint
    with pytest.raises(ConfigError, match="--apply-layernorm-1p is 'given' here but 'not given'"):
        check_checkpoint_args(TransformerConfig(**SHAPE, layernorm_zero_centered_gamma=True), "ckpt")


@pytest.mark.parametrize("moe", [False, True])
def test_recompute_modules_give_the_same_loss_and_gradients(moe):
    extra = dict(num_experts=4, moe_router_topk=2, moe_layer_freq=2, moe_aux_loss_coeff=1e-2) if moe else {}
    plain = _loss_and_grads(_model(**extra))
    modules = ["core_attn", "mlp", "moe"]
    recomputed = _model(**extra, recompute_granularity="selective", recompute_modules=modules)
    assert [layer.recompute_mlp for layer in recomputed.decoder.layers] == [True, True]
    got = _loss_and_grads(recomputed)
    assert torch.equal(plain[0], got[0]) and all(torch.equal(plain[1][n], got[1][n]) for n in plain[1])


def _router(dtype, router_dtype=None, **changes):
    config = TransformerConfig(hidden_size=16, num_attention_heads=2, num_experts=4, moe_router_topk=2,
                               moe_router_dtype=router_dtype, **changes)
    config.params_dtype = dtype
    router = TopKRouter(config, 1, "cpu")
    with torch.no_grad():
        router.weight.copy_(torch.randn(4, 16, generator=torch.Generator().manual_seed(1)))
    return router


def test_router_dtype_fp32_routes_a_bf16_model_in_fp32():
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    probs, indices, _ = _router(torch.bfloat16, "fp32")(x, 6)
    ref = torch.softmax(torch.topk(F.linear(x.float(), _router(torch.bfloat16).weight.float()), 2).values, -1)
    assert probs.dtype == torch.float32 and torch.equal(probs, ref)
    assert _router(torch.bfloat16)(x, 6)[0].dtype == torch.bfloat16  # default: the model's dtype
    y = torch.randn(5, 3, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    w = torch.rand(5, generator=torch.Generator().manual_seed(4))
    rows = torch.tensor([0, 1, 0, 2, 1])
    want = torch.zeros(3, 3).index_add(0, rows, y.float() * w[:, None]).to(torch.bfloat16)
    assert torch.equal(weighted_sum(y, rows, w, 3), want)  # summed in fp32, then the model's dtype


def test_several_balance_losses_add_up_with_their_coefficients():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(5))
    both = _router(torch.float32, moe_router_load_balancing_type=["aux_loss", "seq_aux_loss"],
                   moe_aux_loss_coeff=[1e-2, 1e-3])
    both.losses = RouterLosses()  # what the training loop gives (step_hooks.bind)
    both.losses.start_iteration(1.0, 1)
    probs, indices, aux = both(x, 4)
    scores = torch.softmax(F.linear(x, both.weight), -1)
    counts = torch.bincount(indices.reshape(-1), minlength=4).float()
    want = (aux_losses.switch_load_balancing_loss(scores, counts, 2, 1e-2)
            + aux_losses.sequence_load_balancing_loss(scores, indices, 4, 2, 1e-3))
    torch.testing.assert_close(aux, want, rtol=1e-6, atol=0)
    assert set(both.losses.sums) == {"load_balancing_loss", "seq_load_balancing_loss"}


def test_decoupled_lr_drives_the_embedding_and_output_layer():
    model = _model()
    marked = sorted(n for n, p in model.named_parameters() if is_embedding_or_output(p))
    assert marked == ["output_layer.weight", "word_embeddings.weight"]
    pieces = [types.SimpleNamespace(param=p, main=p) for p in model.parameters()]
    opt = _adamw(pieces, 0.1, 1.0, (0.9, 0.95), 1e-8)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [(sorted(names[id(p)] for p in g["params"]), g["weight_decay"], g["embedding_or_output"])
              for g in opt.param_groups]
    assert [(wd, eo) for _, wd, eo in groups] == [(0.1, False), (0.0, False), (0.1, True), (0.0, True)]
    assert groups[2][0] == marked and groups[3][0] == []
    assert len(groups[0][0]) + len(groups[1][0]) == len(names) - 2
    scheduler = LRScheduler(opt, 1e-3, 1e-4, decay_steps=10, warmup_steps=2, style="linear", decoupled=(5e-3, 5e-4))
    seen = []
    for step in (1, 1, 4, 5):  # after 0, 1, 2, 6, 11 steps
        seen.append((opt.param_groups[0]["lr"], opt.param_groups[2]["lr"]))
        scheduler.step(step)
    seen.append((opt.param_groups[0]["lr"], opt.param_groups[2]["lr"]))
    # warm-up to each peak over 2 steps; at 6 steps half the decay: min + (peak - min) / 2; past 10: the minimum
    want = [(0, 0), (5e-4, 2.5e-3), (1e-3, 5e-3), (5.5e-4, 2.75e-3), (1e-4, 5e-4)]
    assert [x for pair in seen for x in pair] == pytest.approx([x for pair in want for x in pair], rel=1e-12)


def test_default_loss_is_the_mean_of_microbatch_means():
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(3, 1)
    batches = [{"tokens": torch.randn(2, 5, 3, generator=g), "loss_mask": (torch.rand(2, 5, generator=g) > 0.4).float()}
               for _ in range(3)]

    def step(m, batch):
        return {"lm loss": (m(batch["tokens"]).squeeze(-1) ** 2, batch["loss_mask"])}
    losses = forward_backward(model, batches, step, GROUPS, per_token_loss=False)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    means = [(step(model, b)["lm loss"][0] * b["loss_mask"]).sum() / b["loss_mask"].sum() for b in batches]
    (sum(means) / len(means)).backward()
    for a, b in zip(got, model.parameters()):
        torch.testing.assert_close(a, b.grad, rtol=1e-6, atol=1e-7)
    total, count = losses["lm loss"]  # reported per token either way
    assert count == sum(b["loss_mask"].sum() for b in batches)


def _check_keys_rank(groups, cases):
    """{case: the model tensors left as initialised, or the error} of _check_keys for each case."""
    from megatron.core.tensor_parallel.param_meta import set_init_key
    from megatron.training.checkpointing.save_load import _check_keys
    out = {}
    for case, (strictness, model_keys, checkpoint_keys) in cases.items():
        model = torch.nn.Module()
        for i, key in enumerate(model_keys):
            p = torch.nn.Parameter(torch.zeros(1))
            set_init_key(p, key)
            model.register_parameter(f"p{i}", p)
        reader = types.SimpleNamespace(
            path="ckpt", has=lambda k, state="param", c=checkpoint_keys: k in c,
            keys=lambda state="param", c=checkpoint_keys: list(c) if state == "param" else [])
        try:
            out[case] = sorted(_check_keys(reader, model, strictness)[1])
        except Exception as e:  # noqa: BLE001 - the error is what the test reads
            out[case] = type(e).__name__
    return out


STRICTNESS = {  # strictness -> (model tensor "b" the checkpoint lacks, checkpoint tensor "z" the model lacks)
    "assume_ok_unexpected": ("CheckpointError", []), "raise_unexpected": ("CheckpointError", []),
    "raise_all": ("CheckpointError", "CheckpointError"), "log_unexpected": (["b"], []), "log_all": (["b"], []),
    "ignore_all": (["b"], [])}


def test_dist_ckpt_strictness():
    from tests.harness import spawn
    cases = {(k, which): (k, ["a", "b"] if which == 0 else ["a"], ["a"] if which == 0 else ["a", "z"])
             for k in STRICTNESS for which in (0, 1)}
    (got,) = spawn(1, _check_keys_rank, cases)
    assert {case: got[case] for case in cases} == {(k, w): STRICTNESS[k][w] for k, w in cases}


def test_no_mmap_bin_files_reads_the_same_samples(tmp_path):
    from megatron.core.datasets.builder import build_gpt_datasets
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.datasets.indexed_builder import IndexedDatasetBuilder
    prefix = str(tmp_path / "d")
    builder = IndexedDatasetBuilder(prefix, np.int32)
    for i in range(20):
        builder.add_document(np.arange(i, i + 7 + i % 5, dtype=np.int32), [7 + i % 5])
    builder.finalize()
    out = []
    for mmap in (True, False):
        config = GPTDatasetConfig(seq_length=8, seed=1, mmap_bin_files=mmap)
        train = build_gpt_datasets(config, [10, 0, 0], data_path=[prefix], split="1")[0]
        assert (train.indexed._bin is None) is not mmap
        out.append([train[i]["tokens"] for i in range(10)])
    assert all(np.array_equal(a, b) for a, b in zip(*out))
