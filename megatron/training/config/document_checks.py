"""Checks of the packed-document flags (--reset-attention-mask, --dataloader-inter-document-masking)
against the attention backend and the tokenizer, before any process group or batch exists."""
from ...core.config import ConfigError

NO_DOCUMENTS = {"flash": "flash-attn's flash_attn_func takes the causal mask only",
                "te": "Transformer Engine's attention is built here for the causal mask only"}


def document_flag(train_cfg):
    return "--reset-attention-mask" if train_cfg.reset_attention_mask else "--dataloader-inter-document-masking"


def check_documents(model_cfg, train_cfg, tokenizer):
    """Document masks need an attention backend that takes them and an end-of-document id. Raises ConfigError."""
    length = getattr(train_cfg, "mock_document_length", None)
    if length is not None and (length < 1 or not train_cfg.mock_data):
        raise ConfigError(f"--mock-document-length {length}: give a positive mean document length, with --mock-data")
    if not train_cfg.document_masking():
        return
    backend = model_cfg.attention_backend
    if backend in NO_DOCUMENTS:
        raise ConfigError(f"--attention-backend {backend} cannot mask documents ({NO_DOCUMENTS[backend]}) and "
                          f"{document_flag(train_cfg)} needs it; use --attention-backend auto, sdpa or unfused")
    if getattr(tokenizer, "eod", None) is None:
        raise ConfigError(f"{document_flag(train_cfg)} finds documents by their end-of-document token, and the "
                          f"tokenizer {type(tokenizer).__name__} has none; use a tokenizer with an eod id")
