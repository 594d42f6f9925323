"""The embedded corpus as BERT data: a WordPiece vocabulary and one sequence per source line, cached."""
import os

import numpy as np
import pytest

from megatron.core.datasets import IndexedDataset
from megatron.core.datasets.indexed_dataset import DatasetError
from megatron.training.config import TrainingConfig
from megatron.training.embedded import code_sentences, prepare_embedded_bert_data
from megatron.training.tokenizer import build_tokenizer
from tests.data_utils import sample_texts

CORPUS_BYTES = 200_000


def _cfg(cache, **kw):
    cfg = TrainingConfig(data_cache_path=str(cache), embedded_corpus_bytes=CORPUS_BYTES, **kw)
    cfg.validate(1)
    return cfg


def test_built_once_then_reused_one_sequence_per_line(tmp_path):
    logs = []
    cfg = _cfg(tmp_path, embedded_vocab_size=1024)
    prefix = prepare_embedded_bert_data(cfg, log=logs.append)
    assert "built (WordPiece vocabulary (1024 tokens), " in logs[-1] and prefix.endswith("_text_sentence")
    assert cfg.tokenizer_type == "BertWordPieceLowerCase" and cfg.data_path == [prefix]
    assert cfg.vocab_file.startswith(str(tmp_path)) and os.path.isfile(cfg.vocab_file)
    again = _cfg(tmp_path, embedded_vocab_size=1024)
    assert prepare_embedded_bert_data(again, log=logs.append) == prefix and "reused from cache" in logs[-1]
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
    cased = _cfg(tmp_path, tokenizer_type="BertWordPieceCase", embedded_vocab_size=1500)
    prefix = prepare_embedded_bert_data(cased, log=lambda _: None)
    assert cased.tokenizer_type == "BertWordPieceCase" and "cased_1500" in cased.vocab_file
    tok = build_tokenizer(cased)
    assert tok.tokenize("None") != tok.tokenize("none") and IndexedDataset(prefix).num_documents > 10
    given = _cfg(tmp_path, tokenizer_type="BertWordPieceLowerCase", vocab_file=cased.vocab_file)
    other = prepare_embedded_bert_data(given, log=lambda _: None)
    assert given.vocab_file == cased.vocab_file and other != prefix  # the user's vocab, its own dataset


def test_too_small_a_vocabulary_is_a_clear_error(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.embedded_vocab_size = 100  # below what validate() allows: the characters alone need more
    with pytest.raises(DatasetError, match="--embedded-vocab-size 100 is too small .* at least 141"):
        prepare_embedded_bert_data(cfg, log=lambda _: None)
