"""One BERT training sample from sentences: the A/B pair, truncation, special tokens, masking.

Shared by BertDataset (sentences from an indexed dataset) and MockBertDataset (synthetic
sentences). Every random choice comes from the numpy Generator passed in, so a sample is a
pure function of its sentences and that generator's seed.
"""
import numpy as np

MASK_FRACTION, RANDOM_FRACTION = 0.8, 0.1  # of the chosen tokens; the remaining 10% stay unchanged


def special_tokens(binary_head):
    """How many special tokens a sample holds: [CLS] A [SEP] B [SEP], or [CLS] A [SEP]."""
    return 3 if binary_head else 2


def make_pair(sentences, target, rng, task, random_document):
    """(A tokens, B tokens, is_random) from consecutive sentences (at least 2) of one document.

    The sentences are cut at a random point into A and B. task "sop": with probability 0.5, A and
    B swap places (is_random 1). task "nsp": with probability 0.5, B becomes sentences of another
    document from a random sentence on (random_document(rng) -> list of sentences, or None when
    there is no other document, in which case B stays), as many as reach len(A) + len(B) >= target
    (is_random 1).
    """
    cut = int(rng.integers(1, len(sentences)))
    a, b = np.concatenate(sentences[:cut]), np.concatenate(sentences[cut:])
    is_random = 0
    if task == "sop":
        if rng.random() < 0.5:
            a, b, is_random = b, a, 1
    elif rng.random() < 0.5:
        other = random_document(rng)
        if other:
            start = int(rng.integers(len(other)))
            taken, total = [], len(a)
            for sentence in other[start:]:
                taken.append(sentence)
                total += len(sentence)
                if total >= target:
                    break
            b, is_random = np.concatenate(taken), 1
    return a, b, is_random


def truncate_pair(a, b, max_tokens, rng):
    """Drop tokens from the longer segment (B on a tie), each from its front or back at random,
    until len(a) + len(b) <= max_tokens, as Google's BERT does."""
    a_lo, a_hi, b_lo, b_hi = 0, len(a), 0, len(b)
    excess = len(a) + len(b) - max_tokens
    if excess <= 0:
        return a, b
    fronts = rng.random(excess) < 0.5
    for front in fronts:
        if a_hi - a_lo > b_hi - b_lo:
            a_lo, a_hi = (a_lo + 1, a_hi) if front else (a_lo, a_hi - 1)
        else:
            b_lo, b_hi = (b_lo + 1, b_hi) if front else (b_lo, b_hi - 1)
    return a[a_lo:a_hi], b[b_lo:b_hi]


def assemble(a, b, binary_head, seq_length, cls_id, sep_id, pad_id):
    """(text, types, padding_mask, candidates): [CLS] A [SEP] (B [SEP]) then padding to seq_length.

    candidates: the positions of A's and B's tokens (the ones masking may choose).
    """
    la, lb = len(a), len(b)
    length = la + 2 + ((lb + 1) if binary_head else 0)
    if length > seq_length:
        raise ValueError(f"{length} tokens do not fit seq_length {seq_length}")
    text = np.full(seq_length, pad_id, dtype=np.int64)
    types = np.zeros(seq_length, dtype=np.int64)
    text[0], text[1:1 + la], text[1 + la] = cls_id, a, sep_id
    candidates = np.arange(1, 1 + la)
    if binary_head:
        text[2 + la:2 + la + lb], text[2 + la + lb] = b, sep_id
        types[2 + la:length] = 1
        candidates = np.concatenate([candidates, np.arange(2 + la, 2 + la + lb)])
    padding_mask = np.zeros(seq_length, dtype=np.int64)
    padding_mask[:length] = 1
    return text, types, padding_mask, candidates


def random_ids(rng, n, vocab_size, excluded):
    """n ids uniform over [0, vocab_size) without the `excluded` ids."""
    excluded = sorted({int(x) for x in excluded if 0 <= x < vocab_size})
    ids = rng.integers(0, vocab_size - len(excluded), n)
    for e in excluded:  # ascending: each shift past e keeps later comparisons right
        ids[ids >= e] += 1
    return ids


def mask_tokens(text, candidates, rng, masked_lm_prob, vocab_size, mask_id, special_ids):
    """BERT's masked LM in place on text: (labels int64, loss_mask float32).

    round(masked_lm_prob x candidates), at least 1, of the candidate positions are chosen; each
    chosen token becomes [MASK] with probability 0.8, a random id with 0.1 (uniform over the
    vocabulary without the special ids), else stays. labels hold the original id where chosen and
    0 elsewhere: loss_mask (1 where chosen) says which labels count.
    """
    labels = np.zeros(len(text), dtype=np.int64)
    loss_mask = np.zeros(len(text), dtype=np.float32)
    if len(candidates) == 0:
        return labels, loss_mask
    n = max(1, int(round(masked_lm_prob * len(candidates))))
    chosen = rng.choice(candidates, n, replace=False)
    labels[chosen], loss_mask[chosen] = text[chosen], 1.0
    r = rng.random(n)
    replacement = random_ids(rng, n, vocab_size, special_ids)
    to_mask, to_random = r < MASK_FRACTION, (r >= MASK_FRACTION) & (r < MASK_FRACTION + RANDOM_FRACTION)
    text[chosen[to_mask]] = mask_id
    text[chosen[to_random]] = replacement[to_random]
    return labels, loss_mask


def build_sample(sentences, target, rng, config, random_document=None):
    """The sample dict from a run of sentences (list of int arrays) and its target token count.

    config: a BertDatasetConfig (seq_length, binary_head, binary_head_task, masked_lm_prob,
    vocab_size and the special ids). random_document: for NSP, see make_pair.
    """
    if config.binary_head:
        a, b, is_random = make_pair(sentences, target, rng, config.binary_head_task, random_document)
    else:
        a, b, is_random = np.concatenate(sentences), np.zeros(0, dtype=np.int64), 0
    a, b = truncate_pair(a, b, target, rng)
    text, types, padding_mask, candidates = assemble(a, b, config.binary_head, config.seq_length, config.cls_id,
                                                     config.sep_id, config.pad_id)
    labels, loss_mask = mask_tokens(text, candidates, rng, config.masked_lm_prob, config.vocab_size, config.mask_id,
                                    (config.cls_id, config.sep_id, config.mask_id, config.pad_id))
    return {"text": text, "types": types, "labels": labels, "loss_mask": loss_mask,
            "padding_mask": padding_mask, "is_random": np.array(is_random, dtype=np.int64)}
