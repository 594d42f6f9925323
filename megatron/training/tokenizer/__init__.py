"""Tokenizers, picked by --tokenizer-type (Megatron-LM names).

    GPT2BPETokenizer        --vocab-file vocab.json --merge-file merges.txt (byte-level BPE)
    BertWordPieceLowerCase  --vocab-file vocab.txt (BERT WordPiece, lower-cased, accents stripped)
    BertWordPieceCase       --vocab-file vocab.txt (BERT WordPiece, case kept)
    SentencePieceTokenizer  --tokenizer-model x.model (GPTSentencePieceTokenizer is an alias)
    Llama2Tokenizer         --tokenizer-model x.model (SentencePiece; <s> before each text, as Megatron-LM)
    HuggingFaceTokenizer    --tokenizer-model tokenizer.json or a folder (needs `tokenizers`)
    TikTokenizer            --tokenizer-model vocab.json (needs `tiktoken`; --tiktoken-pattern,
                            --tiktoken-num-special-tokens, --tokenizer-special-tokens, --vocab-size)
    NullTokenizer           --vocab-size N (ids written as integers in the text; eod = N)
    ByteTokenizer           UTF-8 bytes, no files

No module here imports torch, so tools/ start fast.
"""
from .base import TokenizerError
from .bert_wordpiece import BertWordPieceTokenizer
from .gpt2_bpe import GPT2BPETokenizer
from .huggingface import HuggingFaceTokenizer
from .sentencepiece_tokenizer import Llama2Tokenizer, SentencePieceTokenizer, train_sentencepiece
from .simple import ByteTokenizer, NullTokenizer
from .tiktoken_tokenizer import TikTokenizer
from .wordpiece_trainer import build_wordpiece_vocab, write_vocab

TOKENIZER_TYPES = ["GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase", "SentencePieceTokenizer",
                   "GPTSentencePieceTokenizer", "Llama2Tokenizer", "HuggingFaceTokenizer", "NullTokenizer",
                   "ByteTokenizer", "TikTokenizer"]


def build_tokenizer(cfg):
    """A tokenizer from anything with tokenizer_type, vocab_file, merge_file, tokenizer_model and
    null_vocab_size (--vocab-size) attributes, and TikTokenizer's tiktoken_pattern, tiktoken_num_special_tokens
    and special_tokens (the TrainingConfig, or the tools' parsed arguments)."""
    kind = cfg.tokenizer_type
    if kind == "GPT2BPETokenizer":
        return GPT2BPETokenizer(cfg.vocab_file, cfg.merge_file)
    if kind in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        return BertWordPieceTokenizer(cfg.vocab_file, lower_case=kind == "BertWordPieceLowerCase")
    if kind in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer"):
        return SentencePieceTokenizer(cfg.tokenizer_model)
    if kind == "Llama2Tokenizer":
        return Llama2Tokenizer(cfg.tokenizer_model)
    if kind == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(cfg.tokenizer_model)
    if kind == "NullTokenizer":
        if cfg.null_vocab_size is None or cfg.null_vocab_size < 1:
            raise TokenizerError("--tokenizer-type NullTokenizer needs --vocab-size N (N >= 1)")
        return NullTokenizer(cfg.null_vocab_size)
    if kind == "TikTokenizer":
        return TikTokenizer(cfg.tokenizer_model, cfg.null_vocab_size, cfg.tiktoken_num_special_tokens,
                            cfg.special_tokens, cfg.tiktoken_pattern)
    if kind == "ByteTokenizer":
        return ByteTokenizer()
    raise TokenizerError(f"unknown --tokenizer-type {kind!r}; choose from {', '.join(TOKENIZER_TYPES)}")


def add_tokenizer_args(parser):
    """The tokenizer flags, for the tools (the trainer generates its own from TrainingConfig)."""
    g = parser.add_argument_group("tokenizer")
    g.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES)
    g.add_argument("--vocab-file", help="GPT2BPETokenizer: vocab.json; BertWordPiece*: vocab.txt")
    g.add_argument("--merge-file", help="GPT2BPETokenizer: merges.txt")
    g.add_argument("--tokenizer-model", help="SentencePiece .model, HF tokenizer.json / folder, or TikTokenizer "
                   "vocabulary .json")
    g.add_argument("--vocab-size", dest="null_vocab_size", type=int,
                   help="NullTokenizer: ids are 0..N-1, eod is N; TikTokenizer: vocabulary size (default 2**17)")
    g.add_argument("--tiktoken-pattern", choices=["v1", "v2"], help="TikTokenizer split pattern (default v2)")
    g.add_argument("--tiktoken-num-special-tokens", type=int, default=1000,
                   help="TikTokenizer: ids reserved for special tokens")
    g.add_argument("--tokenizer-special-tokens", dest="special_tokens", nargs="+",
                   help="TikTokenizer special tokens (must include <unk> <s> </s> <mask> <pad> <cls> <sep>)")
    return g
