"""SentencePiece: load a .model (--tokenizer-model), or train one from text.

Like Megatron-LM's GPTSentencePieceTokenizer: the vocabulary is the model's own
(no extra special tokens), end-of-document is the model's </s> id.
"""
import os

from .base import TokenizerError


def _spm():
    import sentencepiece
    return sentencepiece


class SentencePieceTokenizer:
    def __init__(self, model_file):
        if not model_file:
            raise TokenizerError("--tokenizer-type SentencePieceTokenizer needs --tokenizer-model (a .model "
                                 "file; tools/train_tokenizer.py makes one from text)")
        if not os.path.isfile(model_file):
            raise TokenizerError(f"--tokenizer-model {model_file}: no such file")
        self.model_file = model_file
        self.sp = _spm().SentencePieceProcessor()
        try:
            self.sp.Load(model_file)
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"--tokenizer-model {model_file} is not a SentencePiece model: "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        self.vocab_size = self.sp.GetPieceSize()
        self.eod = self.sp.eos_id()
        if self.eod < 0:
            raise TokenizerError(f"--tokenizer-model {model_file} has no end-of-sentence piece (</s>), "
                                 "which marks the end of each document; train it with eos_id >= 0")

    def tokenize(self, text):
        return self.sp.EncodeAsIds(text)

    def detokenize(self, ids):
        return self.sp.DecodeIds([int(i) for i in ids])

    def __getstate__(self):  # picklable for worker processes: reload from the file
        return {"model_file": self.model_file}

    def __setstate__(self, state):
        self.__init__(state["model_file"])


class Llama2Tokenizer(SentencePieceTokenizer):
    """Megatron-LM's Llama2Tokenizer: a SentencePiece model (--tokenizer-model, read locally) whose
    tokenize() puts the model's <s> (BOS) before the text, as Llama 2's text completion does; no EOS
    is added (end-of-document is </s>, added by preprocess_data.py --append-eod)."""

    def __init__(self, model_file):
        super().__init__(model_file)
        self.bos = self.sp.bos_id()
        if self.bos < 0:
            raise TokenizerError(f"--tokenizer-model {model_file} has no beginning-of-sentence piece (<s>), "
                                 "which Llama2Tokenizer puts before every text; use SentencePieceTokenizer")

    def tokenize(self, text):
        return [self.bos] + self.sp.EncodeAsIds(text)


def train_sentencepiece(documents, model_prefix, vocab_size, model_type="bpe", max_sentences=2_000_000,
                        num_threads=None):
    """Train a SentencePiece model on an iterable of documents (str); writes model_prefix.model/.vocab.

    Every line of a document is one training sentence. The settings keep text exactly
    (identity normalisation, whitespace kept, so code round-trips) and fall back to bytes for
    unseen characters (no <unk> in practice). ids: <unk> 0, <s> 1, </s> 2 (end of document).
    Returns the .model path.
    """
    def sentences():
        for doc in documents:
            for line in doc.split("\n"):
                if line.strip():
                    yield line

    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    try:
        _spm().SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_prefix=model_prefix, vocab_size=vocab_size,
            model_type=model_type, character_coverage=1.0, byte_fallback=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True, split_digits=True, max_sentence_length=16384,
            input_sentence_size=max_sentences, shuffle_input_sentence=True,
            num_threads=num_threads or os.cpu_count() or 1, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            minloglevel=2)
    except RuntimeError as e:
        raise TokenizerError(f"SentencePiece training failed: {str(e).strip().splitlines()[-1]}") from None
    return model_prefix + ".model"
