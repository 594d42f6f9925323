"""The embedded corpus as BERT data: a WordPiece vocabulary and one sequence per source line, cached."""
import os

import numpy as np
import pytest

from megatron.core.datasets import IndexedDataset
from megatron.core.datasets.indexed_dataset import DatasetError
from megatron.training.config.arguments import parse_args
from megatron.training.config.training_config import TrainingConfig
from megatron.training.data.embedded import EmbeddedOptions, code_sentences, prepare_embedded_bert_data
from megatron.training.tokenizer import build_tokenizer
from tests.data_utils import sample_texts

CORPUS_BYTES = 200_000


def _prepare(cache, vocab_size=1024, log=lambda _: None, **kw):
    """The TrainingConfig that the recipe's flags give the trainer, and the dataset prefix."""
    options = EmbeddedOptions(embedded_corpus_bytes=CORPUS_BYTES, embedded_vocab_size=vocab_size)
    cfg = parse_args(prepare_embedded_bert_data(TrainingConfig(data_cache_path=str(cache), **kw), options, log))[1]
    return cfg, cfg.data_path[0]


def test_built_once_then_reused_one_sequence_per_line(tmp_path):
    logs = []
    cfg, prefix = _prepare(tmp_path, log=logs.append)
    assert "built (WordPiece vocabulary (1024 tokens), " in logs[-1] and prefix.endswith("_text_sentence")
    assert cfg.tokenizer_type == "BertWordPieceLowerCase" and cfg.data_path == [prefix]
    assert cfg.vocab_file.startswith(str(tmp_path)) and os.path.isfile(cfg.vocab_file)
    again, again_prefix = _prepare(tmp_path, log=logs.append)
    assert again_prefix == prefix and "reused from cache" in logs[-1]
    assert again.vocab_file == cfg.vocab_file

    tok, ds = build_tokenizer(cfg), IndexedDataset(prefix)
    assert tok.vocab_size == 1024 and ds.dtype == np.uint16
    files = {tuple(tuple(tok.tokenize(s)) for s in code_sentences(d)) for d in sample_texts(CORPUS_BYTES)}
    doc_idx = ds.document_indices
    assert ds.num_documents > 10 and (np.diff(doc_idx) >= 2).all()  # every document has two sentences or more
    for d in range(ds.num_documents):  # each document is one file, each sequence one of its lines
        assert tuple(tuple(ds[i].tolist()) for i in range(doc_idx[d], doc_idx[d + 1])) in files
    all_ids = np.concatenate([ds[i] for i in range(len(ds))])
    assert tok.unk not in all_ids and tok.sep not in all_ids  # every character is in the vocabulary; no eod


def test_cased_and_given_vocab(tmp_path):
    cased, prefix = _prepare(tmp_path, 1500, tokenizer_type="BertWordPieceCase")
    assert cased.tokenizer_type == "BertWordPieceCase" and "cased_1500" in cased.vocab_file
    tok = build_tokenizer(cased)
    assert tok.tokenize("None") != tok.tokenize("none") and IndexedDataset(prefix).num_documents > 10
    given, other = _prepare(tmp_path, tokenizer_type="BertWordPieceLowerCase", vocab_file=cased.vocab_file)
    assert given.vocab_file == cased.vocab_file and other != prefix  # the user's vocab, its own dataset


def test_too_small_a_vocabulary_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="--embedded-vocab-size 100 is too small .* at least 141"):
        _prepare(tmp_path, 100)  # the characters alone need more
