"""The embedded default data: Python's standard-library source, as a real tokenized dataset.

`python pretrain_gpt.py` with no data flags runs the same path as --data-path: the stdlib
.py files (text present on every machine) are, once per machine and cached,
  1. shuffled into a fixed document order (so --split's contiguous ranges are random subsets),
  2. used to train a SentencePiece BPE model (unless another tokenizer is given),
  3. tokenized into a Megatron .bin/.idx dataset,
under <--data-cache-path or ~/.cache/megatron-3d>/embedded/<key>/. The key covers the Python
version, the stdlib location and the byte budget; the dataset name covers the tokenizer.

For BERT (prepare_embedded_bert_data) the same files give a WordPiece vocabulary (unless a vocab
file is given) and a sentence dataset as preprocess_data.py --split-sentences writes it: a source
line (stripped, non-empty) is a sentence, a file is a document, files of fewer than 2 lines are
left out (a BERT sample needs two segments), and no eod is added.
"""
import hashlib
import os
import sys
import sysconfig
import time

import numpy as np

from ..core.datasets.index_cache import default_cache_root, file_lock
from ..core.datasets.indexed_builder import IndexedDatasetBuilder
from ..core.datasets.indexed_dataset import DatasetError, data_file_path, index_file_path, optimal_dtype
from ..core.datasets.text_corpus import stdlib_documents
from .tokenizer import TokenizerError, build_tokenizer, build_wordpiece_vocab, train_sentencepiece, write_vocab

CORPUS_FORMAT = 1
BERT_TOKENIZERS = ("BertWordPieceLowerCase", "BertWordPieceCase")
_DOC_ORDER_SEED = 1234  # the corpus's document order is data, not a training choice


def _md5(*parts):
    h = hashlib.md5()
    for p in parts:
        h.update(str(p).encode() + b"\0")
    return h.hexdigest()


def _file_md5(path):
    with open(path, "rb") as fh:
        return hashlib.md5(fh.read()).hexdigest()


def _tokenizer_key(cfg, tokenizer):
    """Identifies the tokenizer by what it does: a SentencePiece model by its pieces and scores (the
    .model file also records the path it was trained under), other tokenizers by their files."""
    if hasattr(tokenizer, "sp"):
        sp = tokenizer.sp
        return _md5(cfg.tokenizer_type, *[f"{sp.IdToPiece(i)} {sp.GetScore(i)}" for i in range(sp.GetPieceSize())])[:12]
    files = [p for p in (cfg.vocab_file, cfg.merge_file, cfg.tokenizer_model) if p and os.path.isfile(p)]
    if cfg.tokenizer_model and os.path.isdir(cfg.tokenizer_model):
        files.append(os.path.join(cfg.tokenizer_model, "tokenizer.json"))
    return _md5(cfg.tokenizer_type, cfg.vocab_size, *[_file_md5(f) for f in files if os.path.isfile(f)])[:12]


def _documents(max_bytes):
    docs = stdlib_documents(max_bytes)
    order = np.random.RandomState(_DOC_ORDER_SEED).permutation(len(docs))
    return [docs[i].decode("utf-8", errors="replace") for i in order]


def prepare_embedded_data(cfg, log=print):
    """Point cfg (a TrainingConfig without data flags) at the embedded dataset, building it if needed.

    Sets cfg.data_path, and cfg.tokenizer_model when a SentencePiece model is trained here.
    Returns the dataset prefix.
    """
    return _in_cache(cfg, _prepare, log)


def prepare_embedded_bert_data(cfg, log=print):
    """Point cfg at the embedded corpus as BERT sentence data, building it (once, cached) if needed.

    Without a BertWordPiece --tokenizer-type and --vocab-file, a BertWordPieceLowerCase vocabulary of
    cfg.embedded_vocab_size tokens is learned from the corpus (BertWordPieceCase keeps case).
    Sets cfg.tokenizer_type, cfg.vocab_file and cfg.data_path; returns the dataset prefix.
    """
    return _in_cache(cfg, _prepare_bert, log)


def _in_cache(cfg, prepare, log):
    root = cfg.data_cache_path or default_cache_root()
    key = _md5(CORPUS_FORMAT, sys.version_info[:3], sysconfig.get_paths()["stdlib"], cfg.embedded_corpus_bytes)
    folder = os.path.join(root, "embedded", key[:16])
    start = time.perf_counter()
    try:
        os.makedirs(folder, exist_ok=True)
        with file_lock(os.path.join(folder, ".lock")):  # one process per machine builds; the others wait
            prefix, built = prepare(cfg, folder)
    except OSError as e:
        raise DatasetError(f"cannot write the embedded corpus under {root} ({e.strerror or e}); point "
                           "--data-cache-path at a writable directory") from None
    what = f"built ({', '.join(built)}) in {time.perf_counter() - start:.1f} s" if built else "reused from cache"
    log(f"> embedded corpus: Python {sys.version_info[0]}.{sys.version_info[1]} standard-library source, "
        f"{cfg.embedded_corpus_bytes / 1e6:.1f} MB, {what}: {prefix}")
    cfg.data_path = [prefix]
    return prefix


def _prepare(cfg, folder):
    built, docs = [], None
    if cfg.tokenizer_type in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer") and not cfg.tokenizer_model:
        model_prefix = os.path.join(folder, f"spm_bpe_{cfg.embedded_vocab_size}")
        if not os.path.isfile(model_prefix + ".model"):
            docs = docs or _documents(cfg.embedded_corpus_bytes)
            tmp = model_prefix + f".tmp{os.getpid()}"
            train_sentencepiece(docs, tmp, cfg.embedded_vocab_size, "bpe", num_threads=1)
            os.replace(tmp + ".vocab", model_prefix + ".vocab")
            os.replace(tmp + ".model", model_prefix + ".model")
            built.append(f"SentencePiece BPE tokenizer ({cfg.embedded_vocab_size} pieces)")
        cfg.tokenizer_model = model_prefix + ".model"
    tokenizer = build_tokenizer(cfg)
    prefix = os.path.join(folder, f"{cfg.tokenizer_type}-{_tokenizer_key(cfg, tokenizer)}_text_document")
    if not (os.path.isfile(data_file_path(prefix)) and os.path.isfile(index_file_path(prefix))):
        docs = docs or _documents(cfg.embedded_corpus_bytes)
        builder = IndexedDatasetBuilder(prefix, optimal_dtype(tokenizer.vocab_size))
        for doc in docs:
            ids = tokenizer.tokenize(doc) + [tokenizer.eod]
            builder.add_document(ids, [len(ids)])
        builder.finalize()
        built.append(f"{len(docs)} documents tokenized")
    return prefix, built


def code_sentences(doc):
    """A source file's "sentences": its non-empty lines, stripped."""
    return [line.strip() for line in doc.splitlines() if line.strip()]


def _prepare_bert(cfg, folder):
    built, docs = [], None
    if cfg.tokenizer_type not in BERT_TOKENIZERS or not cfg.vocab_file:
        if cfg.tokenizer_type not in BERT_TOKENIZERS:
            cfg.tokenizer_type = "BertWordPieceLowerCase"
        lower = cfg.tokenizer_type == "BertWordPieceLowerCase"
        vocab_file = os.path.join(folder, f"bert_wordpiece_{'lower' if lower else 'cased'}_{cfg.embedded_vocab_size}"
                                          ".vocab.txt")
        if not os.path.isfile(vocab_file):
            docs = _documents(cfg.embedded_corpus_bytes)
            try:
                vocab = build_wordpiece_vocab(docs, cfg.embedded_vocab_size, lower_case=lower)
            except TokenizerError as e:
                raise DatasetError(f"--embedded-vocab-size {cfg.embedded_vocab_size} is too small for the embedded "
                                   f"corpus: {e}") from None
            os.replace(write_vocab(vocab, vocab_file + f".tmp{os.getpid()}"), vocab_file)
            built.append(f"WordPiece vocabulary ({len(vocab)} tokens)")
        cfg.vocab_file = vocab_file
    tokenizer = build_tokenizer(cfg)
    prefix = os.path.join(folder, f"{cfg.tokenizer_type}-{_tokenizer_key(cfg, tokenizer)}_text_sentence")
    if not (os.path.isfile(data_file_path(prefix)) and os.path.isfile(index_file_path(prefix))):
        docs = docs or _documents(cfg.embedded_corpus_bytes)
        builder, kept = IndexedDatasetBuilder(prefix, optimal_dtype(tokenizer.vocab_size)), 0
        for doc in docs:
            sentences = [ids for ids in map(tokenizer.tokenize, code_sentences(doc)) if ids]
            if len(sentences) < 2:
                continue
            for ids in sentences:
                builder.add_item(ids)
            builder.end_document()
            kept += 1
        builder.finalize()
        built.append(f"{kept} documents split into lines and tokenized")
    return prefix, built
