"""--eod-mask-loss, --reset-position-ids, --reset-attention-mask: the masks and positions of a
sample with two end-of-document tokens, by hand, and a model that sees each document alone."""
import pytest
import torch

from megatron.core.config import TransformerConfig
from megatron.core.datasets.gpt_masks import EodOptions, ltor_masks
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.transformer.documents import Documents
from tests.rounding import assert_chain_close

EOD = 0
TOKENS = torch.tensor([[5, 9, EOD, 7, EOD, 3], [1, 2, 3, 4, 5, 6]])


def test_flags_off_give_megatron_plain_batch():
    loss_mask, positions, mask = ltor_masks(TOKENS, EodOptions(EOD))
    assert torch.equal(loss_mask, torch.ones(2, 6)) and positions is None and mask is None


def test_eod_mask_loss_zeroes_predictions_from_eod_inputs():
    loss_mask, _, _ = ltor_masks(TOKENS, EodOptions(EOD, eod_mask_loss=True))
    assert loss_mask.tolist() == [[1, 1, 0, 1, 0, 1], [1, 1, 1, 1, 1, 1]]


def test_reset_position_ids_restart_after_each_eod():
    _, positions, mask = ltor_masks(TOKENS, EodOptions(EOD, reset_position_ids=True))
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]] and mask is None


def test_reset_attention_mask_is_causal_within_each_document():
    _, positions, segments = ltor_masks(TOKENS, EodOptions(EOD, reset_attention_mask=True))
    assert positions is None and segments.tolist() == [[0, 0, 0, 1, 1, 2], [0] * 6]
    mask = Documents(segments).dense_mask()
    assert mask.shape == (2, 1, 6, 6)
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0, 0],
                                         [1, 1, 0, 0, 0, 0],
                                         [1, 1, 1, 0, 0, 0],
                                         [0, 0, 0, 1, 0, 0],
                                         [0, 0, 0, 1, 1, 0],
                                         [0, 0, 0, 0, 0, 1]]
    assert torch.equal(mask[1, 0], torch.ones(6, 6, dtype=torch.bool).tril())


@pytest.mark.parametrize("pos", ["learned_absolute", "rope"])
def test_model_sees_each_document_alone(pos):
    cfg = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, vocab_size=50,
                            hidden_dropout=0.0, attention_dropout=0.0, position_embedding_type=pos,
                            params_dtype=torch.float64)  # whole and parts sum in other orders: fp64 (tests/rounding.py)
    cfg.validate()
    groups = ParallelLayout(1).plan_groups(0)
    torch.manual_seed(0)
    model = GPTModel(cfg, groups).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
        sample = torch.tensor([[5, 9, EOD, 7, 8, 3]])
        _, positions, segments = ltor_masks(sample, EodOptions(EOD, reset_position_ids=True,
                                                               reset_attention_mask=True))
        whole = model(sample, position_ids=positions, attention_mask=Documents(segments))
        first, second = model(sample[:, :3]), model(sample[:, 3:])
        assert_chain_close(whole, torch.cat([first, second], dim=1), "the documents alone")
        assert not torch.allclose(whole[:, 3:], model(sample)[:, 3:])  # the plain causal model sees doc 1
