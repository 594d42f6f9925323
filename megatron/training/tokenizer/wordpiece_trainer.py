"""Learn a BERT WordPiece vocabulary from text, so a corpus is all a BERT run needs.

The words are those BertWordPieceTokenizer sees (same cleaning, casing and splitting). Like HF's
WordPiece trainer, pieces are learned by BPE: every word starts as its characters ("d", "##o",
"##g"), and the most frequent adjacent pair is merged ("d" + "##o" -> "do") until the vocabulary
is full. The vocabulary, in id order:

    [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4       (the order HF's BertTokenizer defaults to)
    every character seen, sorted, then each one's "##" form (so any text made of seen
    characters tokenizes without [UNK])
    merged pieces, most frequent first (ties: the lexicographically smaller pair)

Deterministic: the same texts give the same file.
"""
import heapq
from collections import Counter, defaultdict

from .base import TokenizerError
from .bert_wordpiece import CONTINUATION, MAX_WORD_CHARS, SPECIAL_TOKENS, split_words


def count_words(texts, lower_case):
    """word -> occurrences, over the words the tokenizer would see (over-long words never match)."""
    counts = Counter()
    for text in texts:
        counts.update(split_words(text, lower_case))
    for word in [w for w in counts if len(w) > MAX_WORD_CHARS]:
        del counts[word]
    return counts


def _merged(a, b):
    return a + b[len(CONTINUATION):]


class _PairCounts:
    """Adjacent-pair counts over all words, kept current as words change, with a heap whose stale
    entries are skipped on pop: each merge touches only the words that hold the pair."""

    def __init__(self, words, freqs):
        self.words, self.freqs = words, freqs
        self.count, self.where, self.heap = defaultdict(int), defaultdict(set), []
        for w in range(len(words)):
            self._add(w, +1, push=False)
        self.heap = [(-n, pair) for pair, n in self.count.items()]
        heapq.heapify(self.heap)

    def _add(self, w, sign, push=True):
        symbols, freq = self.words[w], self.freqs[w]
        for pair in zip(symbols, symbols[1:]):
            self.count[pair] += sign * freq
            if sign > 0:
                self.where[pair].add(w)
            if push:
                heapq.heappush(self.heap, (-self.count[pair], pair))

    def best(self, min_count):
        """The most frequent pair with at least min_count occurrences, or None."""
        while self.heap:
            neg, pair = self.heap[0]
            if -neg == self.count.get(pair, 0) and -neg >= min_count:
                return pair
            heapq.heappop(self.heap)
            if -neg == self.count.get(pair, 0):  # current but too rare: so is everything after it
                return None
        return None

    def merge(self, pair):
        a, b = pair
        for w in sorted(self.where.pop(pair, ())):
            symbols = self.words[w]
            self._add(w, -1)
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
                    out.append(_merged(a, b))
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            self.words[w] = out
            self._add(w, +1)
        self.count.pop(pair, None)


def build_wordpiece_vocab(texts, vocab_size, lower_case=True, min_count=2):
    """texts (iterable of str) -> the vocabulary (list of tokens; index = id), at most vocab_size long.

    Raises TokenizerError if vocab_size cannot hold the special tokens and every character seen
    (both forms); learning stops early when no pair occurs min_count times.
    """
    counts = count_words(texts, lower_case)
    chars = sorted({c for w in counts for c in w})
    vocab = list(SPECIAL_TOKENS) + chars + [CONTINUATION + c for c in chars]
    if vocab_size < len(vocab):
        raise TokenizerError(f"a vocabulary of {vocab_size} cannot hold the {len(SPECIAL_TOKENS)} special tokens and "
                             f"the {len(chars)} characters of the text (each also as ##c); use a vocab size of at "
                             f"least {len(vocab)}")
    seen = set(vocab)
    ordered = sorted(counts)  # a fixed word order, so ties resolve the same way every run
    words = [[w[0]] + [CONTINUATION + c for c in w[1:]] for w in ordered]
    pairs = _PairCounts(words, [counts[w] for w in ordered])
    while len(vocab) < vocab_size:
        pair = pairs.best(min_count)
        if pair is None:
            break
        pairs.merge(pair)
        piece = _merged(*pair)
        if piece not in seen:
            seen.add(piece)
            vocab.append(piece)
    return vocab


def write_vocab(vocab, path):
    """One token per line (the id is the line number), as --vocab-file reads it."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(t + "\n" for t in vocab))
    return str(path)
