"""The packed-document flags against the attention backend and the tokenizer (config/document_checks.py)."""
import types

import pytest

from megatron.core.errors import ConfigError
from megatron.training.config.document_checks import check_documents


def _cfgs(backend="auto", reset=True):
    model = types.SimpleNamespace(attention_backend=backend)
    train = types.SimpleNamespace(reset_attention_mask=reset, dataloader_inter_document_masking=False,
                                  document_masking=lambda: reset, mock_data=True, mock_document_length=None)
    return model, train


def test_a_tokenizer_without_eod_is_refused():
    with pytest.raises(ConfigError, match="--reset-attention-mask finds documents by their end-of-document token"):
        check_documents(*_cfgs(), types.SimpleNamespace(eod=None))
    check_documents(*_cfgs(), types.SimpleNamespace(eod=3))
    check_documents(*_cfgs(reset=False), types.SimpleNamespace())  # no masks: no eod needed


@pytest.mark.parametrize("backend", ["flash", "te"])
def test_backends_without_document_masks_are_refused(backend):
    with pytest.raises(ConfigError, match=f"--attention-backend {backend} cannot mask documents"):
        check_documents(*_cfgs(backend), types.SimpleNamespace(eod=3))


def test_mock_document_length_must_be_positive_with_mock_data():
    model, train = _cfgs()
    train.mock_document_length = 0
    with pytest.raises(ConfigError, match="--mock-document-length 0: give a positive mean document length"):
        check_documents(model, train, types.SimpleNamespace(eod=3))
