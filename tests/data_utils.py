"""Real text and real tokenizer files made inside the tests (nothing downloaded).

    texts = sample_texts()                                # stdlib source + unicode edge cases
    vocab, merges = make_gpt2_files(tmp, texts)           # a byte-level BPE trained here
    model = make_sentencepiece(tmp, texts)                # a SentencePiece BPE model
    run_tool("preprocess_data.py", [...])                 # the CLI, as a user runs it
"""
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EDGE_CASES = ["", "x", "héllo wörld — ünïcode ✓ 日本語テキスト", "emoji 🙂🚀 and\ttabs\nand\n\nnewlines",
              "  leading and trailing spaces  ", "numbers 12345 67.89 and under_scores", "<|endoftext|> literal"]


def sample_texts(max_bytes=200_000):
    """Python stdlib source files (real text, on every machine) followed by the edge cases."""
    from megatron.core.datasets.text_corpus import stdlib_documents
    docs = [d.decode("utf-8", errors="replace") for d in stdlib_documents(max_bytes)]
    return docs + EDGE_CASES


def write_jsonl(path, texts, key="text"):
    with open(path, "w", encoding="utf-8") as fh:
        for t in texts:
            fh.write(json.dumps({key: t}) + "\n")
    return str(path)


def make_gpt2_files(folder, texts, num_merges=300):
    """Train a small byte-level BPE the way GPT-2's was made; write vocab.json and merges.txt."""
    from megatron.training.tokenizer.gpt2_bpe import bytes_to_unicode, pretokenize
    byte_sym = bytes_to_unicode()
    words = Counter("".join(byte_sym[b] for b in tok.encode("utf-8")) for t in texts for tok in pretokenize(t))
    vocab = {s: i for i, s in enumerate(byte_sym[b] for b in range(256))}
    splits = {w: tuple(w) for w in words}
    merges = []
    for _ in range(num_merges):
        pairs = Counter()
        for w, n in words.items():
            s = splits[w]
            for pair in zip(s, s[1:]):
                pairs[pair] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
        for w, s in splits.items():
            out, i = [], 0
            while i < len(s):
                if i < len(s) - 1 and (s[i], s[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            splits[w] = tuple(out)
    vocab["<|endoftext|>"] = len(vocab)
    vocab_file, merge_file = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
    with open(vocab_file, "w", encoding="utf-8") as fh:
        json.dump(vocab, fh, ensure_ascii=False)
    with open(merge_file, "w", encoding="utf-8") as fh:
        fh.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return vocab_file, merge_file


def make_sentencepiece(folder, texts, vocab_size=600):
    from megatron.training.tokenizer import train_sentencepiece
    return train_sentencepiece(texts, os.path.join(folder, "spm"), vocab_size, num_threads=1)


def make_hf_tokenizer(folder, vocab_file, merge_file):
    """A Hugging Face byte-level BPE tokenizer.json over the same vocab and merges (needs `tokenizers`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(vocab_file, merge_file))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])  # as Hugging Face's GPT-2 tokenizer (Megatron-LM's GPT2BPETokenizer)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    return path


def run_tool(script, args, timeout=300):
    """Run tools/<script> as a user would; returns CompletedProcess (not checked)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", script)] + [str(a) for a in args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def preprocess(jsonl, prefix, tokenizer_args, *extra):
    """tools/preprocess_data.py with --append-eod; returns the dataset prefix written."""
    proc = run_tool("preprocess_data.py", ["--input", jsonl, "--output-prefix", prefix, "--append-eod",
                                           *tokenizer_args, *extra])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return f"{prefix}_text_document"


def make_data(prefix, n_docs=200, seed=0, low=0, high=1000):
    """An IndexedDataset of n_docs random documents (0 to 119 tokens in [low, high), then `high`)."""
    from megatron.core.datasets import IndexedDatasetBuilder
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(str(prefix), np.uint16)
    for _ in range(n_docs):
        doc = rng.integers(low, high, int(rng.integers(0, 120))).tolist() + [high]
        b.add_document(doc, [len(doc)])
    b.finalize()
    return str(prefix)


def all_tokens(ds, n):
    """The first n samples' tokens of a GPTDataset, stacked: [n, seq_length + 1]."""
    return np.stack([ds[i]["tokens"] for i in range(n)])
