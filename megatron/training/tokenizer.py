"""Tokenizers available before the data pipeline lands: NullTokenizer and a byte-level one."""


class NullTokenizer:
    """Ids are the text's whitespace-separated integers; vocab_size given, eod = vocab_size - 1."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1

    def tokenize(self, text):
        return [int(t) for t in text.split()]

    def detokenize(self, ids):
        return " ".join(str(i) for i in ids)


class ByteTokenizer:
    """UTF-8 bytes 0..255 are the ids; 256 is end-of-document. Needs no files."""

    vocab_size = 257
    eod = 256

    def tokenize(self, text):
        return list(text.encode("utf-8"))

    def detokenize(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def build_tokenizer(train_config):
    if train_config.tokenizer_type == "NullTokenizer":
        return NullTokenizer(train_config.vocab_size)
    return ByteTokenizer()
