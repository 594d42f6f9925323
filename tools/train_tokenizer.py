"""Train a tokenizer from plain text or jsonl, so a corpus is all you need.

    python tools/train_tokenizer.py --input corpus.jsonl --model-prefix tok/my-spm --vocab-size 32000
    # -> tok/my-spm.model ; then preprocess and train with
    #    --tokenizer-type SentencePieceTokenizer --tokenizer-model tok/my-spm.model

    python tools/train_tokenizer.py --tokenizer-type BertWordPieceLowerCase --input corpus.jsonl \
        --model-prefix tok/my-bert --vocab-size 30522
    # -> tok/my-bert.vocab.txt ; use it with --tokenizer-type BertWordPieceLowerCase --vocab-file tok/my-bert.vocab.txt

Files ending in .jsonl or .json are read one JSON object per line (--json-keys fields); any
other file is plain text, each line a sentence. SentencePiece (the default): identity
normalisation, whitespace kept and byte fallback, so any text (code too) round-trips; </s> (id 2)
is the end-of-document token. BertWordPiece*: a WordPiece vocabulary learned from the text
(megatron/training/tokenizer/wordpiece_trainer.py), [PAD] [UNK] [CLS] [SEP] [MASK] = ids 0-4.
"""
import json
import os
import sys

if __package__ in (None, ""):  # run from a checkout: make `megatron` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.errors import MegatronUserError
from megatron.training.config.output_paths import check_writable
from megatron.training.tokenizer import (
    BertWordPieceTokenizer,
    SentencePieceTokenizer,
    TokenizerError,
    build_wordpiece_vocab,
    train_sentencepiece,
    write_vocab,
)
from tools.tool_args import ToolParser, has_text

BERT_TYPES = ("BertWordPieceLowerCase", "BertWordPieceCase")


def documents(paths, json_keys):
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            if not path.endswith((".jsonl", ".json")):
                yield from fh
                continue
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                    yield from (doc[k] for k in json_keys if isinstance(doc.get(k), str))
                except (ValueError, AttributeError):
                    print(f"warning: {path} line {lineno}: not a JSON object; skipped", file=sys.stderr)


def main(argv=None):
    p = ToolParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--input", nargs="+", required=True, help="text or jsonl files")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="fields read from jsonl (default text)")
    p.add_argument("--tokenizer-type", default="SentencePieceTokenizer",
                   choices=("SentencePieceTokenizer",) + BERT_TYPES,
                   help="SentencePieceTokenizer (default) writes PREFIX.model and PREFIX.vocab; "
                        "BertWordPiece* writes PREFIX.vocab.txt (for --vocab-file)")
    p.add_argument("--model-prefix", required=True, help="output path prefix (see --tokenizer-type)")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"], help="SentencePiece only")
    p.add_argument("--max-sentences", type=int, default=2_000_000,
                   help="SentencePiece only: sample at most this many lines")
    args = p.parse_args(argv)
    if args.vocab_size < 1 or args.max_sentences < 1:
        p.error("--vocab-size and --max-sentences must be at least 1")
    try:
        for path in args.input:
            if not os.path.isfile(path):
                raise TokenizerError(f"--input {path}: no such file")
        if not any(has_text(path) for path in args.input):
            raise TokenizerError(f"--input {' '.join(args.input)}: no text to learn from (empty files)")
        check_writable(args.model_prefix, "--model-prefix", kind="file")
        if args.tokenizer_type in BERT_TYPES:
            return _train_wordpiece(args)
        model = train_sentencepiece(documents(args.input, args.json_keys), args.model_prefix, args.vocab_size,
                                    args.model_type, args.max_sentences)
        tok = SentencePieceTokenizer(model)
    except (MegatronUserError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {model} ({tok.vocab_size} pieces, end-of-document id {tok.eod}); use it with "
          f"--tokenizer-type SentencePieceTokenizer --tokenizer-model {model}")
    return 0


def _train_wordpiece(args):
    lower = args.tokenizer_type == "BertWordPieceLowerCase"
    vocab = build_wordpiece_vocab(documents(args.input, args.json_keys), args.vocab_size, lower_case=lower)
    path = args.model_prefix + ".vocab.txt"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_vocab(vocab, path + ".partial")  # a stopped run never leaves a vocab that looks complete
    os.replace(path + ".partial", path)
    tok = BertWordPieceTokenizer(path, lower_case=lower)
    print(f"wrote {path} ({tok.vocab_size} tokens, [SEP] = end of document = id {tok.eod}); use it with "
          f"--tokenizer-type {args.tokenizer_type} --vocab-file {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
