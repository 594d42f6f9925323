"""A Hugging Face `tokenizers` tokenizer from a local tokenizer.json (or a folder holding one).

Optional dependency (`pip install tokenizers`); nothing is downloaded. Text is encoded
without the tokenizer's own special tokens (no BOS): documents are separated by eod,
which is the eos_token of tokenizer_config.json when present, else the first of the usual
end-of-text tokens that the vocabulary has.
"""
import json
import os

from .base import TokenizerError

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "[SEP]")


def _eos_from_config(folder):
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        eos = json.load(fh).get("eos_token")
    return eos.get("content") if isinstance(eos, dict) else eos


class HuggingFaceTokenizer:
    def __init__(self, path):
        if not path:
            raise TokenizerError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model "
                                 "(a local tokenizer.json, or a folder containing one)")
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise TokenizerError(f"--tokenizer-model {path}: no tokenizer.json there (only local files are "
                                 "used; nothing is downloaded)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError("--tokenizer-type HuggingFaceTokenizer needs the optional `tokenizers` "
                                 "package: pip install tokenizers") from None
        self.path = path
        try:
            self._tok = Tokenizer.from_file(file)
        except Exception as e:  # the Rust side raises its own exception types
            raise TokenizerError(f"--tokenizer-model {file} could not be read: {e}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        candidates = [_eos_from_config(os.path.dirname(os.path.abspath(file)))] + list(EOD_CANDIDATES)
        ids = [self._tok.token_to_id(t) for t in candidates if t]
        ids = [i for i in ids if i is not None]
        if not ids:
            raise TokenizerError(f"--tokenizer-model {file} has none of the end-of-document tokens "
                                 f"{', '.join(EOD_CANDIDATES)} and no eos_token in tokenizer_config.json")
        self.eod = ids[0]

    def tokenize(self, text):
        return self._tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids):
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])
