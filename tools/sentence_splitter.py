"""A small rule-based sentence splitter for preprocess_data.py --split-sentences (no nltk, no downloads).

A sentence ends after . ! or ? (a run of them, then any closing quotes or brackets) when
whitespace follows and the next text starts like a sentence: an upper-case letter, a digit, or an
opening quote or bracket. It also ends after the full-width 。！？, which need no space. A "."
does not end one after a known abbreviation ("Mr.", "Dr.", "e.g.", "i.e.", "vs."), a dotted
acronym ("U.S.", "U.K.") or a single letter (the "J." of "J. Smith").

Newlines: by default every line break also ends a sentence and sentences are stripped. With
keep_newlines=True line breaks are ordinary whitespace and each sentence keeps the whitespace after
it, so joining the sentences gives the text back. Sentences of only whitespace are dropped.
"""
import re

ABBREVIATIONS = frozenset((
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "cf", "al", "fig", "figs", "eq",
    "eqs", "no", "nos", "vol", "vols", "ch", "sec", "pp", "approx", "dept", "est", "inc", "ltd", "co",
    "corp", "gov", "gen", "col", "lt", "sgt", "capt", "rev", "hon", "jan", "feb", "mar", "apr", "jun", "jul",
    "aug", "sep", "sept", "oct", "nov", "dec"))

_END = re.compile(r"""[.!?]+['"’”»)\]]*\s+|[。！？]+\s*""")
_OPENERS = "\"'“‘«(["
_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # U.S, e.g, i.e, a.m (before the final ".")


def _is_abbreviation(text, end):
    """Whether the "." that ends text[:end] belongs to the word before it, not to a sentence end."""
    start = end
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in _OPENERS:
        start -= 1
    word = text[start:end]
    return (len(word) == 1 and word.isalpha()) or word.lower() in ABBREVIATIONS or bool(_DOTTED.fullmatch(word))


def _boundaries(text):
    """Indices where a sentence ends (just after the whitespace that follows it)."""
    for m in _END.finditer(text):
        if m.group()[0] in ".!?":
            after = text[m.end():m.end() + 1]
            if not (after.isupper() or after.isdigit() or (after and after in _OPENERS)):
                continue
            if m.group().rstrip() == "." and _is_abbreviation(text, m.start()):
                continue
        yield m.end()


def split_sentences(text, keep_newlines=False):
    """text -> list of its sentences (see the module docstring for the rules)."""
    if not keep_newlines:
        return [s.strip() for line in text.splitlines() for s in split_sentences(line, True) if s.strip()]
    out, start = [], 0
    for end in _boundaries(text):
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return [s for s in out if s.strip()]
