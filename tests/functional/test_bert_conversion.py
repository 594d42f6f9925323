"""HuggingFace BertForPreTraining / BertForMaskedLM <-> our checkpoints: exact round trip, and
the same MLM and binary-head logits as transformers at TP 1 and 2 (fp32, 1e-5)."""
import pytest
import torch

from megatron.core.checkpointing import CheckpointReader, find_checkpoint, local_shard
from tests.harness import spawn

from .test_conversion import _convert

transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 1000, 12


def tiny_bert(path, binary_head=True, act="gelu"):
    """A small randomly initialised HF BERT (norms and biases perturbed too), saved to `path`."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=32, hidden_act=act)
    model = (transformers.BertForPreTraining if binary_head else transformers.BertForMaskedLM)(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval().save_pretrained(path)
    return model


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, SEQ), generator=g)
    types = (torch.arange(SEQ) >= 5).long().expand(3, SEQ).clone()
    mask = torch.ones(3, SEQ, dtype=torch.long)
    mask[1, 9:] = 0  # padded tails: HF and we must both ignore them as keys
    mask[2, 6:] = 0
    return ids, types, mask


def _our_logits(groups, ckpt):
    from megatron.core.inference.generation import config_from_checkpoint
    from megatron.core.models.bert import BertModel
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region
    from megatron.core.tensor_parallel.param_meta import param_meta
    torch.set_num_threads(1)
    reader = CheckpointReader(find_checkpoint(ckpt))
    config = config_from_checkpoint(reader.metadata["args"]["model"], groups.tp_size)
    model = BertModel(config, groups, add_binary_head=reader.has("pooler.weight"))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(local_shard(reader.global_tensor(param_meta(p).init_key), p, groups.tp_rank, groups.tp_size))
        ids, types, mask = _inputs()
        logits, binary = model.eval()(ids, mask, types)
        logits = gather_from_tensor_model_parallel_region(logits, groups.tp)[..., :VOCAB]
    return logits, binary


@pytest.mark.slow
@pytest.mark.parametrize("binary_head,act", [(True, "gelu"), (False, "gelu_new")])
def test_hf_bert_round_trip_and_logits(tmp_path, binary_head, act):
    hf_dir, ours, back = (str(tmp_path / n) for n in ("hf", "ours", "back"))
    model = tiny_bert(hf_dir, binary_head, act)
    convert = _convert()
    assert convert(["--model-type", "BERT", "--loader", "hf", "--saver", "megatron", "--load-dir", hf_dir,
                    "--save-dir", ours]) == 0
    assert convert(["--model-type", "BERT", "--loader", "megatron", "--saver", "hf", "--load-dir", ours,
                    "--save-dir", back]) == 0
    cls = transformers.BertForPreTraining if binary_head else transformers.BertForMaskedLM
    again = cls.from_pretrained(back, local_files_only=True)
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after the round trip"

    ids, types, mask = _inputs()
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    ref = out.prediction_logits if binary_head else out.logits
    real = mask.bool()
    for tp in (1, 2):
        for logits, binary in spawn(tp, _our_logits, ours, tp=tp):
            # padded positions' outputs are don't-care (each side attends differently there)
            torch.testing.assert_close(logits[real], ref[real], rtol=1e-5, atol=1e-5)
            if binary_head:
                torch.testing.assert_close(binary, out.seq_relationship_logits, rtol=1e-5, atol=1e-5)
            else:
                assert binary is None


def test_pre_norm_bert_does_not_convert_to_hf(tmp_path):
    from megatron.core.checkpointing import CheckpointError
    from megatron.core.models.families import bert
    with pytest.raises(CheckpointError, match="--post-norm"):
        bert.to_hf({"post_norm": False, "hidden_size": 8, "num_attention_heads": 2}, {})


@pytest.mark.slow
def test_trained_post_norm_checkpoint_converts_to_hf_with_the_same_logits(tmp_path):
    from .cli import run_cli
    ckpt, hf_dir = str(tmp_path / "ckpt"), str(tmp_path / "hf")
    run_cli(["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB - 1), "--num-layers", "2",
             "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32", "--train-iters", "3",
             "--eval-iters", "0", "--post-norm", "--tensor-model-parallel-size", "2", "--save", ckpt],
            nproc=2, script="pretrain_bert.py")
    assert _convert()(["--model-type", "BERT", "--loader", "megatron", "--saver", "hf", "--load-dir", ckpt,
                       "--save-dir", hf_dir]) == 0
    model = transformers.BertForPreTraining.from_pretrained(hf_dir, local_files_only=True).eval()
    ids, types, mask = _inputs()
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    real = mask.bool()
    (logits, binary), = spawn(1, _our_logits, ckpt)
    torch.testing.assert_close(logits[real], out.prediction_logits[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(binary, out.seq_relationship_logits, rtol=1e-5, atol=1e-5)


def test_a_non_bert_hf_model_is_refused_for_model_type_bert(tmp_path):
    from .test_conversion import tiny_hf
    tiny_hf("gpt2", str(tmp_path / "hf"))
    code = _convert()(["--model-type", "BERT", "--loader", "hf", "--saver", "megatron",
                       "--load-dir", str(tmp_path / "hf"), "--save-dir", str(tmp_path / "ours")])
    assert code == 2
    assert not (tmp_path / "ours").exists()
