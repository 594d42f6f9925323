"""The embedded recipe: `python pretrain_gpt.py` (or pretrain_bert.py) with no data flag trains on
Python's standard-library source, prepared here as an ordinary tokenized dataset.

As nanoGPT's prepare.py, this step runs before the trainer parses its flags and hands it
ordinary ones (embedded_recipe): the recipe's own settings (RECIPE, pinned so that a change of the
CLI defaults never changes this run), then the user's flags (which override them), then
--data-path and the tokenizer flags of the prepared corpus. The trainer knows nothing of it.

The stdlib .py files (text present on every machine) are, once per machine and cached,
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
import dataclasses
import hashlib
import os
import sys
import sysconfig
import time
from dataclasses import dataclass

import numpy as np

from ...core.config import ConfigError, opt
from ...core.datasets.index_cache import default_cache_root, file_lock
from ...core.datasets.indexed_builder import IndexedDatasetBuilder
from ...core.datasets.indexed_dataset import DatasetError, data_file_path, index_file_path, optimal_dtype
from ...core.datasets.text_corpus import stdlib_documents
from ..config.arguments import parse_args
from ..tokenizer import TokenizerError, build_tokenizer, build_wordpiece_vocab, train_sentencepiece, write_vocab

CORPUS_FORMAT = 1
BERT_TOKENIZERS = ("BertWordPieceLowerCase", "BertWordPieceCase")
_DOC_ORDER_SEED = 1234  # the corpus's document order is data, not a training choice

# The recipe's settings: the CLI defaults of the day the recipe was made, written out so that the
# no-argument run trains the same however the defaults change (they are Megatron-LM's now: --lr has
# none, linear decay, no warm-up, weight decay 0.01, beta2 0.999, log and eval every 100, ...).
RECIPE = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "256",
          "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--init-method-std", "0.02",
          "--micro-batch-size", "8", "--train-iters", "200", "--lr", "1e-3", "--min-lr", "1e-4",
          "--lr-decay-style", "cosine", "--lr-wsd-decay-style", "linear", "--lr-warmup-iters", "20",
          "--weight-decay", "0.1", "--clip-grad", "1.0",
          "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8", "--seed", "1234",
          "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10", "--split", "969,30,1"]


@dataclass
class EmbeddedOptions:
    """The recipe's own flags (listed in --help; meaningless with data flags)."""
    embedded_corpus_bytes: int = opt(
        4_000_000, "Bytes of Python standard-library source used by the embedded recipe (no data flags).")
    embedded_vocab_size: int = opt(1024, "Pieces of the SentencePiece model (WordPiece tokens for BERT) trained "
                                   "for the embedded recipe.")


EMBEDDED = ("embedded recipe (used when no data flag is given)", EmbeddedOptions)


def embedded_recipe(argv, extra=(), bert=False, log=print):
    """The trainer's argv: `argv` itself when it names data (or asks for --help); else RECIPE + argv +
    --data-path and tokenizer flags of the embedded corpus (GPT documents, or BERT sentences with
    `bert`), built once per machine and cached. extra: the entry's (title, dataclass) flag groups,
    EMBEDDED last. Raises ConfigError, DatasetError or TokenizerError."""
    if "-h" in argv or "--help" in argv:
        return list(argv)
    parsed = parse_args(argv, extra=extra)
    cfg, options = parsed[1], parsed[-1]
    if cfg.mock_data or cfg.data_path or any(cfg.per_split_paths):
        if options != EmbeddedOptions():
            raise ConfigError("--embedded-corpus-bytes / --embedded-vocab-size go with the embedded recipe, "
                              "used only without data flags (--data-path, --mock-data, ...)")
        return list(argv)
    flags = (prepare_embedded_bert_data if bert else prepare_embedded_data)(cfg, options, log)
    log(f"> embedded recipe (no data flags given): {' '.join(RECIPE + flags)}; flags given override its settings")
    return RECIPE + list(argv) + flags


def _trainer_flags(cfg, prefix):
    """--data-path and the tokenizer flags that name what the corpus was tokenized with."""
    flags = ["--data-path", prefix, "--tokenizer-type", cfg.tokenizer_type]
    for flag, value in (("--tokenizer-model", cfg.tokenizer_model), ("--vocab-file", cfg.vocab_file),
                        ("--merge-file", cfg.merge_file)):
        flags += [flag, value] if value else []
    return flags


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
    return _md5(cfg.tokenizer_type, cfg.null_vocab_size, *[_file_md5(f) for f in files if os.path.isfile(f)])[:12]


def _documents(max_bytes):
    docs = stdlib_documents(max_bytes)
    order = np.random.RandomState(_DOC_ORDER_SEED).permutation(len(docs))
    return [docs[i].decode("utf-8", errors="replace") for i in order]


def prepare_embedded_data(cfg, options, log=print):
    """Build the embedded GPT dataset (once, cached) for cfg's tokenizer flags (a TrainingConfig;
    default: a SentencePiece model trained here) under --data-cache-path. -> the trainer flags
    that point at it (--data-path, --tokenizer-type and its files)."""
    cfg = dataclasses.replace(cfg, tokenizer_type=cfg.tokenizer_type or "SentencePieceTokenizer")
    if cfg.tokenizer_type == "NullTokenizer":
        raise ConfigError("--tokenizer-type NullTokenizer cannot tokenize the embedded text corpus; "
                          "use --mock-data or --data-path")
    if options.embedded_vocab_size < 300:
        raise ConfigError("--embedded-vocab-size must be at least 300 (256 byte pieces + text pieces)")
    return _in_cache(cfg, options, _prepare, log)


def prepare_embedded_bert_data(cfg, options, log=print):
    """Build the embedded corpus as BERT sentence data (once, cached). Without a BertWordPiece
    --tokenizer-type and --vocab-file, a BertWordPieceLowerCase vocabulary of --embedded-vocab-size
    tokens is learned from the corpus (BertWordPieceCase keeps case). -> the trainer flags."""
    return _in_cache(dataclasses.replace(cfg), options, _prepare_bert, log)


def _in_cache(cfg, options, prepare, log):
    """prepare(cfg, options, folder) in the corpus's cache folder, one process at a time; cfg is the
    caller's copy, pointed at what was built. -> the trainer flags."""
    root = cfg.data_cache_path or default_cache_root()
    key = _md5(CORPUS_FORMAT, sys.version_info[:3], sysconfig.get_paths()["stdlib"], options.embedded_corpus_bytes)
    folder = os.path.join(root, "embedded", key[:16])
    start = time.perf_counter()
    try:
        os.makedirs(folder, exist_ok=True)
        with file_lock(os.path.join(folder, ".lock")):  # one process per machine builds; the others wait
            prefix, built = prepare(cfg, options, folder)
    except OSError as e:
        raise DatasetError(f"cannot write the embedded corpus under {root} ({e.strerror or e}); point "
                           "--data-cache-path at a writable directory") from None
    what = f"built ({', '.join(built)}) in {time.perf_counter() - start:.1f} s" if built else "reused from cache"
    log(f"> embedded corpus: Python {sys.version_info[0]}.{sys.version_info[1]} standard-library source, "
        f"{options.embedded_corpus_bytes / 1e6:.1f} MB, {what}: {prefix}")
    return _trainer_flags(cfg, prefix)


def _prepare(cfg, options, folder):
    built, docs = [], None
    if cfg.tokenizer_type in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer") and not cfg.tokenizer_model:
        model_prefix = os.path.join(folder, f"spm_bpe_{options.embedded_vocab_size}")
        if not os.path.isfile(model_prefix + ".model"):
            docs = docs or _documents(options.embedded_corpus_bytes)
            tmp = model_prefix + f".tmp{os.getpid()}"
            train_sentencepiece(docs, tmp, options.embedded_vocab_size, "bpe", num_threads=1)
            os.replace(tmp + ".vocab", model_prefix + ".vocab")
            os.replace(tmp + ".model", model_prefix + ".model")
            built.append(f"SentencePiece BPE tokenizer ({options.embedded_vocab_size} pieces)")
        cfg.tokenizer_model = model_prefix + ".model"
    tokenizer = build_tokenizer(cfg)
    prefix = os.path.join(folder, f"{cfg.tokenizer_type}-{_tokenizer_key(cfg, tokenizer)}_text_document")
    if not (os.path.isfile(data_file_path(prefix)) and os.path.isfile(index_file_path(prefix))):
        docs = docs or _documents(options.embedded_corpus_bytes)
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


def _prepare_bert(cfg, options, folder):
    built, docs = [], None
    if cfg.tokenizer_type not in BERT_TOKENIZERS or not cfg.vocab_file:
        if cfg.tokenizer_type not in BERT_TOKENIZERS:
            cfg.tokenizer_type = "BertWordPieceLowerCase"
        lower = cfg.tokenizer_type == "BertWordPieceLowerCase"
        name = f"bert_wordpiece_{'lower' if lower else 'cased'}_{options.embedded_vocab_size}.vocab.txt"
        vocab_file = os.path.join(folder, name)
        if not os.path.isfile(vocab_file):
            docs = _documents(options.embedded_corpus_bytes)
            try:
                vocab = build_wordpiece_vocab(docs, options.embedded_vocab_size, lower_case=lower)
            except TokenizerError as e:
                raise DatasetError(f"--embedded-vocab-size {options.embedded_vocab_size} is too small for the embedded "
                                   f"corpus: {e}") from None
            os.replace(write_vocab(vocab, vocab_file + f".tmp{os.getpid()}"), vocab_file)
            built.append(f"WordPiece vocabulary ({len(vocab)} tokens)")
        cfg.vocab_file = vocab_file
    tokenizer = build_tokenizer(cfg)
    prefix = os.path.join(folder, f"{cfg.tokenizer_type}-{_tokenizer_key(cfg, tokenizer)}_text_sentence")
    if not (os.path.isfile(data_file_path(prefix)) and os.path.isfile(index_file_path(prefix))):
        docs = docs or _documents(options.embedded_corpus_bytes)
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
