"""Join indexed datasets (.bin/.idx) into one, in the order given, streaming.

    python tools/merge_datasets.py --input data/part-a_text_document data/part-b_text_document \\
        --output-prefix data/all_text_document
    python tools/merge_datasets.py --input data/parts/ --output-prefix data/all_text_document

A folder stands for every dataset in it (sorted by name). All inputs must share one dtype.
"""
import os
import sys

if __package__ in (None, ""):  # run from a checkout: make `megatron` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.core.datasets.indexed_builder import IndexedDatasetBuilder
from megatron.core.datasets.indexed_dataset import DatasetError, normalize_prefix, read_header
from megatron.core.datasets.tokenizer_record import merged_record, record_path, write_record
from megatron.core.errors import MegatronUserError
from megatron.training.config.output_paths import check_writable
from tools.tool_args import ToolParser


def input_prefixes(inputs):
    out = []
    for path in inputs:
        if os.path.isdir(path):
            found = sorted({normalize_prefix(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".idx")})
            if not found:
                raise DatasetError(f"--input {path}: no .idx files in this folder")
            out += found
        else:
            out.append(normalize_prefix(path))
    return out


def main(argv=None):
    p = ToolParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--input", nargs="+", required=True, help="dataset prefixes, or folders of them")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    args = p.parse_args(argv)
    builder = None
    try:
        prefixes = input_prefixes(args.input)
        dtype = read_header(prefixes[0] + ".idx")[0]
        out = normalize_prefix(args.output_prefix)
        if out in prefixes:
            raise DatasetError(f"--output-prefix {out} is also an input")
        record = merged_record(prefixes)  # two tokenizers' ids in one dataset: refused before writing
        check_writable(out, "--output-prefix", kind="file")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        builder = IndexedDatasetBuilder(out, dtype)
        for prefix in prefixes:
            builder.add_index(prefix)
            print(f"added {prefix} ({builder.num_doc_indices - 1} documents so far)", file=sys.stderr)
        builder.finalize()
        if os.path.exists(record_path(out)):  # a stale one of an earlier dataset of that name
            os.remove(record_path(out))
        if record is not None:
            write_record(out, record)
    except (MegatronUserError, OSError) as e:
        if builder is not None:
            builder.abort()
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}.bin/.idx from {len(prefixes)} datasets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
