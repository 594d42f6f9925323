"""tools/generate.py on an MoE checkpoint trained by pretrain_gpt.py (4 experts, top-2, alltoall, the
expert bias after one update): EP2 and TP2 x EP2 generate one process's greedy tokens, and the logits
at EP2 (a different prompt on each EP rank, so tokens really cross ranks) equal one process's."""
import pytest
import torch

from megatron.core.checkpointing import CheckpointReader, find_checkpoint
from tests.harness import spawn

from .cli import run_cli
from .test_parity import BASE

MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "96", "--disable-bias-linear",
       "--moe-token-dispatcher-type", "alltoall", "--moe-router-enable-expert-bias",
       "--moe-router-bias-update-rate", "0.05",
       "--init-method-std", "0.5"]  # weights large enough that every expert decides the greedy tokens
PROMPTS = [[5, 6, 7, 8], [901, 17, 333, 2], [64, 64, 1, 998]]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    save = str(tmp_path_factory.mktemp("moegen") / "ck")
    run_cli(BASE + MOE + ["--train-iters", "2", "--eval-iters", "0", "--save", save, "--save-interval", "1",
                          "--exit-interval", "1"])
    reader = CheckpointReader(find_checkpoint(save))
    assert reader.global_tensor("decoder.layers.0.mlp.router.expert_bias", "buffer").abs().min() > 0
    return save


def _tokens(ckpt, prompt_file, nproc, layout=()):
    out = run_cli(["--load", ckpt, "--prompt-file", prompt_file, "--max-new-tokens", "8", *layout], nproc=nproc,
                  script="tools/generate.py").stdout
    return [line for line in out.splitlines() if line.startswith("generated ids: ")]


@pytest.mark.slow
def test_generate_at_ep2_and_tp2xep2_gives_one_process_tokens(ckpt, tmp_path):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("".join(" ".join(map(str, p)) + "\n" for p in PROMPTS))
    single = _tokens(ckpt, str(prompt_file), 1)
    assert len(single) == len(PROMPTS)
    for nproc, layout in ((2, ["--expert-model-parallel-size", "2"]),
                          (4, ["--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2"])):
        assert _tokens(ckpt, str(prompt_file), nproc, layout) == single, layout


def _logits(groups, ckpt, ep):
    from megatron.core import parallel_state
    from megatron.core.inference.generation import forward_with_cache, load_model
    from megatron.core.transformer.kv_cache import KVCache
    groups = parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=ep)  # the harness built EP 1
    model, _, _ = load_model(ckpt, groups, torch.device("cpu"))
    # rank r runs prompt r (one process: all of them), so at EP2 each rank's tokens visit the other's experts
    ids = torch.tensor(PROMPTS[:2] if ep == 1 else [PROMPTS[groups.ep_rank]])
    experts = sorted(model.decoder.layers[0].mlp.experts.local_experts)
    return forward_with_cache(model, ids, KVCache()), experts


@pytest.mark.slow
def test_logits_at_ep2_equal_one_process(ckpt):
    ((single, _),) = spawn(1, _logits, ckpt, 1)
    ranks = spawn(2, _logits, ckpt, 2)
    assert [experts for _, experts in ranks] == [["0", "1"], ["2", "3"]]
    diff = max((got[0] - single[r]).abs().max().item() for r, (got, _) in enumerate(ranks))
    print(f"max |logits EP2 - one process| {diff:.3g}")
    assert diff < 1e-5, diff


def test_expert_parallel_flags_on_a_dense_checkpoint_are_refused():
    from megatron.core.config import TransformerConfig
    from megatron.core.errors import ConfigError
    from megatron.core.inference.generation import config_from_checkpoint
    dense = vars(TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=100))
    assert config_from_checkpoint(dense, 1).num_experts is None
    with pytest.raises(ConfigError, match="the checkpoint is a dense model"):
        config_from_checkpoint(dense, 1, ep=2)
