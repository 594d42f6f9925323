"""Tokenizers that need no files: NullTokenizer (ids as text) and ByteTokenizer (UTF-8 bytes)."""


class NullTokenizer:
    """Ids are the text's whitespace-separated integers, as in Megatron-LM.

    --vocab-size N gives ids 0..N-1 for data and N for end-of-document, so vocab_size = N + 1.
    """

    def __init__(self, vocab_size):
        self.vocab_size = int(vocab_size) + 1
        self.eod = int(vocab_size)

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
