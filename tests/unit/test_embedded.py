"""The embedded default corpus: built once into the cache (never the package), then reused."""
import os

import numpy as np

from megatron.core.datasets import IndexedDataset
from megatron.core.datasets.text_corpus import stdlib_documents
from megatron.training.config.arguments import parse_args
from megatron.training.config.training_config import TrainingConfig
from megatron.training.data.embedded import EmbeddedOptions, prepare_embedded_data
from megatron.training.tokenizer import build_tokenizer

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "megatron")


def _prepare(cache, log, **kw):
    """The TrainingConfig that the recipe's flags give the trainer, and the dataset prefix."""
    options = EmbeddedOptions(embedded_corpus_bytes=300_000, embedded_vocab_size=400)
    cfg = parse_args(prepare_embedded_data(TrainingConfig(data_cache_path=str(cache), **kw), options, log))[1]
    return cfg, cfg.data_path[0]


def _package_files():
    return {os.path.join(d, f) for d, _, fs in os.walk(PACKAGE) for f in fs if "__pycache__" not in d}


def test_built_once_then_reused_and_decodes_to_the_stdlib_text(tmp_path):
    before = _package_files()
    logs = []
    cfg, prefix = _prepare(tmp_path, logs.append)
    assert cfg.tokenizer_type == "SentencePieceTokenizer"
    assert "built (SentencePiece BPE tokenizer (400 pieces), " in logs[-1]
    again, again_prefix = _prepare(tmp_path, logs.append)
    assert again_prefix == prefix and "reused from cache" in logs[-1]
    assert again.tokenizer_model == cfg.tokenizer_model and again.data_path == [prefix]
    assert prefix.startswith(str(tmp_path)) and _package_files() == before

    tok = build_tokenizer(cfg)
    ds = IndexedDataset(prefix)
    originals = {d.decode("utf-8", errors="replace") for d in stdlib_documents(300_000)}
    assert ds.num_documents == len(originals) and ds.dtype == np.uint16
    for i in range(3):  # shuffled order, each document exactly the tokenizer's ids + eod
        doc = ds.document(i).tolist()
        assert doc[-1] == tok.eod and tok.detokenize(doc[:-1]) in originals

    _, byte_prefix = _prepare(tmp_path, logs.append, tokenizer_type="ByteTokenizer")
    assert byte_prefix != prefix and os.path.dirname(byte_prefix) == os.path.dirname(prefix)
    assert IndexedDataset(byte_prefix).num_tokens == sum(len(d.encode()) + 1 for d in originals)
