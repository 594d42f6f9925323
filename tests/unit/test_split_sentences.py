"""The sentence splitter (tests/functional/test_split_sentences.py runs preprocess_data.py --split-sentences)."""
import pytest

from tools.sentence_splitter import split_sentences


@pytest.mark.parametrize("text, sentences", [
    ("Hello there. How are you? I am fine!  Thanks.", ["Hello there.", "How are you?", "I am fine!", "Thanks."]),
    ("Mr. Smith met Dr. Jones in the U.S. Army. They talked, e.g. about No. 5 and vs. Rome. Then left.",
     ["Mr. Smith met Dr. Jones in the U.S. Army.", "They talked, e.g. about No. 5 and vs. Rome.", "Then left."]),
    ("J. R. R. Tolkien wrote books. It grew 3.5% in 2020. 42 is an answer.",
     ["J. R. R. Tolkien wrote books.", "It grew 3.5% in 2020.", "42 is an answer."]),
    ('"Wow," she said. "Really?" (Yes.) [Citation.] Done.',
     ['"Wow," she said.', '"Really?"', "(Yes.)", "[Citation.]", "Done."]),
    ("lower case. does not split. x = a.b + c. Done", ["lower case. does not split. x = a.b + c. Done"]),
    ("Wait... What?! Stop.", ["Wait...", "What?!", "Stop."]),
    ("line one\nline two. Next\n\n  \n third ", ["line one", "line two.", "Next", "third"]),
    ("中文句子。第二句！第三句？好", ["中文句子。", "第二句！", "第三句？", "好"]),
    ("", []), ("   \n\t\n", []),
])
def test_splitter_cases(text, sentences):
    assert split_sentences(text) == sentences


def test_keep_newlines_keeps_the_text():
    text = "  First line\nstill first. Second one.\n\nThird!\n"
    parts = split_sentences(text, keep_newlines=True)
    assert parts == ["  First line\nstill first. ", "Second one.\n\n", "Third!\n"] and "".join(parts) == text
