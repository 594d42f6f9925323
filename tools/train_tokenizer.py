"""Train a SentencePiece tokenizer from plain text or jsonl, so a corpus is all you need.

    python tools/train_tokenizer.py --input corpus.jsonl --model-prefix tok/my-spm --vocab-size 32000
    # -> tok/my-spm.model ; then preprocess and train with
    #    --tokenizer-type SentencePieceTokenizer --tokenizer-model tok/my-spm.model

Files ending in .jsonl or .json are read one JSON object per line (--json-keys fields); any
other file is plain text, each line a sentence. Identity normalisation, whitespace kept and
byte fallback, so any text (code too) round-trips; </s> (id 2) is the end-of-document token.
"""
import argparse
import json
import os
import sys

if __package__ in (None, ""):  # run from a checkout: make `megatron` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.training.tokenizer import SentencePieceTokenizer, TokenizerError, train_sentencepiece  # noqa: E402


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--input", nargs="+", required=True, help="text or jsonl files")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="fields read from jsonl (default text)")
    p.add_argument("--model-prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"])
    p.add_argument("--max-sentences", type=int, default=2_000_000, help="sample at most this many lines")
    args = p.parse_args(argv)
    try:
        for path in args.input:
            if not os.path.isfile(path):
                raise TokenizerError(f"--input {path}: no such file")
        model = train_sentencepiece(documents(args.input, args.json_keys), args.model_prefix, args.vocab_size,
                                    args.model_type, args.max_sentences)
        tok = SentencePieceTokenizer(model)
    except TokenizerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {model} ({tok.vocab_size} pieces, end-of-document id {tok.eod}); use it with "
          f"--tokenizer-type SentencePieceTokenizer --tokenizer-model {model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
