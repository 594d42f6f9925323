"""tools/preprocess_data.py --tokenizer-type TikTokenizer writes the tokenizer's ids (+ eod </s>)."""
import pytest

from megatron.core.datasets import IndexedDataset
from tests.data_utils import preprocess, write_jsonl
from tests.unit.test_tiktokenizer import write_vocab

pytest.importorskip("tiktoken")


def test_preprocess_writes_tiktoken_ids(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.json")
    texts = ["hello hello!", "he said</s>", ""]
    prefix = preprocess(write_jsonl(tmp_path / "in.jsonl", texts), tmp_path / "out",
                        ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", vocab, "--vocab-size", "1260",
                         "--tiktoken-pattern", "v2", "--tiktoken-num-special-tokens", "1000"])
    ds = IndexedDataset(prefix)
    said = [1000 + b for b in b" said"]
    assert [ds[i].tolist() for i in range(len(ds))] == [[1259, 1032, 1259, 1033, 2], [1256] + said + [2, 2]]
    assert list(ds.document_indices) == [0, 1, 2, 2]
