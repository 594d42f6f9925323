"""Bad input through the real command lines, as a new user types it: every case exits 2 before the first
iteration with exactly one `error:` line on stderr naming the flag or file, and no traceback.

Cases of tests/functional/test_errors.py are not repeated here. "{d}" in an argument is the folder of
the shared files (the `files` fixture): a small byte-level dataset, one whose out-of-vocabulary id
first appears late, junk and empty files, a folder, a broken checkpoint, and those of bad_input_files.py.
The one-process cases run from one Python start (forked.py: a child per case, as `python script args`
would run it), seconds for all instead of 2-3 s each; the torchrun cases launch torchrun.
"""
import ast
import importlib.util
import json
import os
import re
import resource
import subprocess
import sys

import numpy as np
import pytest

from megatron.core.datasets import IndexedDatasetBuilder

from .bad_input_files import write_byte_data_and_sentencepiece, write_garbage_index, write_hf_moe
from .cli import PINNED, REPO, run_cli

GPT, BERT = "pretrain_gpt.py", "pretrain_bert.py"
PRE, MERGE, TOK = "tools/preprocess_data.py", "tools/merge_datasets.py", "tools/train_tokenizer.py"
CONVERT, GENERATE = "tools/checkpoint/convert.py", "tools/generate.py"
PLAN, ESTIMATE = "tools/plan.py", "tools/estimate_memory.py"
MOCK = ["--mock-data", "--vocab-size", "64", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "16", "--train-iters", "2", "--eval-iters", "0", "--micro-batch-size", "2"]
BYTE = ["--tokenizer-type", "ByteTokenizer", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads",
        "2", "--seq-length", "16", "--train-iters", "2", "--eval-iters", "0", "--micro-batch-size", "2"]
DATA = BYTE + ["--data-path", "{d}/good"]
TOKDATA = MOCK[3:] + ["--data-path", "{d}/good"]  # the tokenizer type and files follow
GPT2 = ["--tokenizer-type", "GPT2BPETokenizer"]
MOE = MOCK + ["--num-experts", "2", "--disable-bias-linear"]
TINY_MODEL = ["--vocab-size", "64", "--hidden-size", "32", "--num-attention-heads", "2"]  # for the planning tools

# id: (script, arguments, text the error line holds: the flag or the file)
CASES = {
    # sizes and counts at 0 or below (tracebacks before: TP 0, query groups 0, kv channels, global batch)
    "tp 0": (GPT, MOCK + ["--tensor-model-parallel-size", "0"], "--tensor-model-parallel-size"),
    "pp 0": (GPT, MOCK + ["--pipeline-model-parallel-size", "0"], "--pipeline-model-parallel-size"),
    "query groups 0": (GPT, MOCK + ["--group-query-attention", "--num-query-groups", "0"], "--num-query-groups"),
    "kv channels 0": (GPT, MOCK + ["--kv-channels", "0"], "--kv-channels"),
    "kv channels -4": (GPT, MOCK + ["--kv-channels", "-4"], "--kv-channels"),
    "global batch 0": (GPT, MOCK + ["--global-batch-size", "0"], "--global-batch-size"),
    "global batch -8": (GPT, MOCK + ["--global-batch-size", "-8"], "--global-batch-size"),
    "micro batch 0": (GPT, MOCK + ["--micro-batch-size", "0"], "--micro-batch-size"),
    "layers 0": (GPT, MOCK + ["--num-layers", "0"], "--num-layers"),
    "hidden -1": (GPT, MOCK + ["--hidden-size", "-1"], "--hidden-size"),
    "seq length 0": (GPT, MOCK + ["--seq-length", "0"], "--seq-length"),
    "ffn 0": (GPT, MOCK + ["--ffn-hidden-size", "0"], "--ffn-hidden-size"),
    "vocab multiple 0": (GPT, MOCK + ["--make-vocab-size-divisible-by", "0"], "--make-vocab-size-divisible-by"),
    "train iters 0": (GPT, MOCK + ["--train-iters", "0"], "--train-iters"),
    "log interval 0": (GPT, MOCK + ["--log-interval", "0"], "--log-interval"),
    "eval interval 0": (GPT, MOCK + ["--eval-interval", "0"], "--eval-interval"),
    "eval iters -1": (GPT, MOCK + ["--eval-iters", "-1"], "--eval-iters"),
    "save interval 0": (GPT, MOCK + ["--save-interval", "0"], "--save-interval"),
    "exit interval 0": (GPT, MOCK + ["--exit-interval", "0"], "--exit-interval"),
    "bucket 0": (GPT, MOCK + ["--ddp-bucket-size", "0"], "--ddp-bucket-size"),
    "hysteresis 0": (GPT, MOCK + ["--hysteresis", "0"], "--hysteresis"),
    "null vocab 0": (GPT, MOCK + ["--vocab-size", "0"], "--vocab-size"),
    "first stage layers -1": (GPT, MOCK + ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers",
                                           "-1"], "--decoder-first-pipeline-num-layers"),
    # real numbers: NaN, inf, out of range (tracebacks or silently wrong before)
    "init std -1": (GPT, MOCK + ["--init-method-std", "-1"], "--init-method-std"),
    "beta1 1.5": (GPT, MOCK + ["--adam-beta1", "1.5"], "--adam-beta1"),
    "beta2 nan": (GPT, MOCK + ["--adam-beta2", "nan"], "--adam-beta2"),
    "adam eps -1": (GPT, MOCK + ["--adam-eps", "-1"], "--adam-eps"),
    "seed -1": (GPT, MOCK + ["--seed", "-1"], "--seed"),
    "lr nan": (GPT, MOCK + ["--lr", "nan"], "--lr"),
    "lr inf": (GPT, MOCK + ["--lr", "inf"], "--lr"),
    "lr -1e-3": (GPT, MOCK + ["--lr", "-1e-3"], "--lr"),
    "min lr nan": (GPT, MOCK + ["--min-lr", "nan"], "--min-lr"),
    "min lr above lr": (GPT, MOCK + ["--lr", "1e-4", "--min-lr", "1e-3"], "--min-lr"),
    "norm eps -1": (GPT, MOCK + ["--norm-epsilon", "-1"], "--norm-epsilon"),
    "rotary base 0": (GPT, MOCK + ["--position-embedding-type", "rope", "--rotary-base", "0"], "--rotary-base"),
    "warmup -5": (GPT, MOCK + ["--lr-warmup-iters", "-5"], "--lr-warmup-iters"),
    "decay -5": (GPT, MOCK + ["--lr-decay-iters", "-5"], "--lr-decay-iters"),
    "wsd decay -3": (GPT, MOCK + ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "-3"], "--lr-wsd-decay-iters"),
    "wsd longer than decay": (GPT, MOCK + ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "50"],
                              "--lr-wsd-decay-iters"),
    "warmup fraction nan": (GPT, MOCK + ["--lr-warmup-fraction", "nan"], "--lr-warmup-fraction"),
    "initial loss scale -1": (GPT, MOCK + ["--fp16", "--initial-loss-scale", "-1"], "--initial-loss-scale"),
    "min loss scale 0": (GPT, MOCK + ["--fp16", "--min-loss-scale", "0"], "--min-loss-scale"),
    "min loss scale above initial": (GPT, MOCK + ["--fp16", "--initial-loss-scale", "1024", "--min-loss-scale",
                                                  "4096"], "--min-loss-scale"),
    "loss scale nan": (GPT, MOCK + ["--fp16", "--loss-scale", "nan"], "--loss-scale"),
    "hidden dropout nan": (GPT, MOCK + ["--hidden-dropout", "nan"], "--hidden-dropout"),
    "attention dropout 1": (GPT, MOCK + ["--attention-dropout", "1"], "--attention-dropout"),
    "clip grad nan": (GPT, MOCK + ["--clip-grad", "nan"], "--clip-grad"),
    "weight decay inf": (GPT, MOCK + ["--weight-decay", "inf"], "--weight-decay"),
    # outputs found unwritable only at the first save (or after the whole run) before; --load
    "save under /proc": (GPT, MOCK + ["--save", "/proc/megatron-ckpt"], "--save /proc/megatron-ckpt"),
    "save is a file": (GPT, MOCK + ["--save", "{d}/in.jsonl"], "--save"),
    "tensorboard under a file": (GPT, MOCK + ["--tensorboard-dir", "{d}/in.jsonl/tb"], "--tensorboard-dir"),
    "trace is a folder": (GPT, MOCK + ["--pipeline-trace", "{d}/folder"], "--pipeline-trace"),
    "trace under a file": (GPT, MOCK + ["--pipeline-trace", "{d}/in.jsonl/trace.json"], "--pipeline-trace"),
    "pytorch profiler without tensorboard": (GPT, MOCK + ["--profile", "--use-pytorch-profiler"], "--tensorboard-dir"),
    "wandb files under a file": (GPT, MOCK + ["--wandb-project", "p", "--wandb-save-dir", "{d}/in.jsonl/w"],
                                 "--wandb-save-dir" if importlib.util.find_spec("wandb") else "pip install"),
    "load missing": (GPT, MOCK + ["--load", "{d}/nothere"], "--load"),
    "load empty folder": (GPT, MOCK + ["--load", "{d}/folder"], "--load"),
    "load tracker without checkpoint": (GPT, MOCK + ["--load", "{d}/badckpt"], "iter_0000007"),
    # data
    "odd blend": (GPT, BYTE + ["--data-path", "0.5", "{d}/good", "0.5"], "--data-path has 3 items"),
    "odd blend, weight inside": (GPT, BYTE + ["--data-path", "{d}/good", "0.5", "{d}/good"], "--data-path"),
    "odd per-split blend": (GPT, BYTE + ["--train-data-path", "0.5", "{d}/good", "1"], "--train-data-path"),
    "split -1,2,0": (GPT, DATA + ["--split", "-1,2,0"], "--split"),
    "split of four": (GPT, DATA + ["--split", "1,2,3,4"], "--split"),
    "data path a folder": (GPT, BYTE + ["--data-path", "{d}/folder"], "folder.idx"),
    "data path a jsonl": (GPT, BYTE + ["--data-path", "{d}/in.jsonl"], "in.jsonl.idx"),
    "token id past the vocabulary late": (GPT, BYTE + ["--data-path", "{d}/late"], "late: token id 5000"),
    "cache path a file": (GPT, DATA + ["--data-cache-path", "{d}/in.jsonl"], "--data-cache-path"),
    # tokenizer files: missing, junk, a folder
    "gpt2 vocab missing": (GPT, TOKDATA + GPT2 + ["--vocab-file", "{d}/nothere.json", "--merge-file", "{d}/junk"],
                           "--vocab-file"),
    "gpt2 vocab junk": (GPT, TOKDATA + GPT2 + ["--vocab-file", "{d}/junk", "--merge-file", "{d}/junk"],
                        "--vocab-file"),
    "gpt2 vocab a folder": (GPT, TOKDATA + GPT2 + ["--vocab-file", "{d}/folder", "--merge-file", "{d}/junk"],
                            "--vocab-file"),
    "gpt2 without merges": (GPT, TOKDATA + GPT2 + ["--vocab-file", "{d}/junk"], "--merge-file"),
    "sentencepiece junk": (GPT, TOKDATA + ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                                           "{d}/junk"], "--tokenizer-model"),
    "sentencepiece a folder": (GPT, TOKDATA + ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                                               "{d}/folder"], "--tokenizer-model"),
    "hf tokenizer junk": (GPT, TOKDATA + ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "{d}/junk"],
                          "--tokenizer-model"),
    "wordpiece vocab junk": (GPT, TOKDATA + ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", "{d}/junk"],
                             "--vocab-file"),
    # BERT's own options
    "bert mask prob 0": (BERT, MOCK + ["--mask-prob", "0"], "--mask-prob"),
    "bert mask prob nan": (BERT, MOCK + ["--mask-prob", "nan"], "--mask-prob"),
    "bert short seq prob 2": (BERT, MOCK + ["--short-seq-prob", "2"], "--short-seq-prob"),
    "bert seq length 3": (BERT, MOCK + ["--seq-length", "3"], "--seq-length"),
    "bert mock vocab 3": (BERT, MOCK + ["--vocab-size", "3"], "--vocab-size"),
    "bert adam eps nan": (BERT, MOCK + ["--adam-eps", "nan"], "--adam-eps"),
    # tools
    "preprocess empty input": (PRE, ["--input", "{d}/empty.jsonl", "--output-prefix", "{d}/out/x", "--tokenizer-type",
                                     "ByteTokenizer"], "--input"),
    "preprocess blank lines": (PRE, ["--input", "{d}/blank.jsonl", "--output-prefix", "{d}/out/x", "--tokenizer-type",
                                     "ByteTokenizer"], "--input"),
    "preprocess only malformed": (PRE, ["--input", "{d}/bad.jsonl", "--output-prefix", "{d}/out/x", "--tokenizer-type",
                                        "ByteTokenizer", "--skip-malformed"], "--input"),
    "preprocess prefix under a file": (PRE, ["--input", "{d}/in.jsonl", "--output-prefix", "{d}/in.jsonl/x",
                                             "--tokenizer-type", "ByteTokenizer"], "--output-prefix"),
    "preprocess workers 0": (PRE, ["--input", "{d}/in.jsonl", "--output-prefix", "{d}/out/x", "--tokenizer-type",
                                   "ByteTokenizer", "--workers", "0"], "--workers"),
    "preprocess input a folder": (PRE, ["--input", "{d}/folder", "--output-prefix", "{d}/out/x", "--tokenizer-type",
                                        "ByteTokenizer"], "--input"),
    "preprocess missing flag": (PRE, ["--input", "{d}/in.jsonl", "--tokenizer-type", "ByteTokenizer"],
                                "--output-prefix"),
    "merge folder without datasets": (MERGE, ["--input", "{d}/folder", "--output-prefix", "{d}/out/m"], "--input"),
    "merge missing input": (MERGE, ["--input", "{d}/nothere", "--output-prefix", "{d}/out/m"], "nothere.idx"),
    "merge prefix under a file": (MERGE, ["--input", "{d}/good", "--output-prefix", "{d}/in.jsonl/m"],
                                  "--output-prefix"),
    "train tokenizer vocab 0": (TOK, ["--input", "{d}/in.jsonl", "--model-prefix", "{d}/out/t", "--vocab-size", "0"],
                                "--vocab-size"),
    "train tokenizer prefix under a file": (TOK, ["--input", "{d}/in.jsonl", "--model-prefix", "{d}/in.jsonl/t"],
                                            "--model-prefix"),
    "train tokenizer empty input": (TOK, ["--input", "{d}/empty.jsonl", "--model-prefix", "{d}/out/t"], "--input"),
    "train tokenizer bad type": (TOK, ["--input", "{d}/in.jsonl", "--model-prefix", "{d}/out/t", "--tokenizer-type",
                                       "Byte"], "--tokenizer-type"),
    "convert missing checkpoint": (CONVERT, ["--loader", "megatron", "--saver", "hf", "--load-dir", "{d}/nothere",
                                             "--save-dir", "{d}/out/hf"], "nothere"),
    "convert hf folder without config": (CONVERT, ["--loader", "hf", "--saver", "megatron", "--load-dir",
                                                   "{d}/folder", "--save-dir", "{d}/out/mg"], "--load-dir"),
    "generate missing checkpoint": (GENERATE, ["--load", "{d}/nothere", "--prompt-ids", "1"], "--load"),
    "generate broken checkpoint": (GENERATE, ["--load", "{d}/badckpt", "--prompt-ids", "1"], "iter_0000007"),
    # issue 41: argparse's usage block, all four sampling rules in one message
    "generate no prompt": (GENERATE, ["--load", "{d}/badckpt"], "one of the arguments --prompt-ids --prompt"),
    "generate top-p 2": (GENERATE, ["--load", "{d}/badckpt", "--prompt-ids", "1", "--top-p", "2"],
                         "--top-p must be in (0, 1], got 2.0"),
    "generate temperature nan": (GENERATE, ["--load", "{d}/badckpt", "--prompt-ids", "1", "--temperature", "nan"],
                                 "--temperature must be a positive number, got nan"),
    "generate top-k -1": (GENERATE, ["--load", "{d}/badckpt", "--prompt-ids", "1", "--top-k", "-1"], "--top-k must"),
    # issue 26: tracebacks before
    "capacity factor nan": (GPT, MOE + ["--moe-expert-capacity-factor", "nan"], "--moe-expert-capacity-factor"),
    "capacity factor inf": (GPT, MOE + ["--moe-expert-capacity-factor", "inf"], "--moe-expert-capacity-factor"),
    "cp 0": (GPT, MOCK + ["--context-parallel-size", "0"], "--context-parallel-size"),
    "estimate world size 0": (ESTIMATE, TINY_MODEL + ["--world-size", "0"], "--world-size"),
    "plan fix tp=abc": (PLAN, TINY_MODEL + ["--fix", "tp=abc"], "--fix 'tp=abc'"),
    # issue 26: silently accepted before
    "moe ffn 0": (GPT, MOE + ["--moe-ffn-hidden-size", "0"], "--moe-ffn-hidden-size"),
    "moe aux loss coeff -1": (GPT, MOE + ["--moe-aux-loss-coeff", "-1"], "--moe-aux-loss-coeff"),
    "moe bias update rate -1": (GPT, MOE + ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "-1"],
                                "--moe-router-bias-update-rate"),
    "offload fraction without offload": (GPT, MOCK + ["--optimizer-offload-fraction", "0.5"],
                                         "--optimizer-offload-fraction 0.5 goes with --optimizer-cpu-offload"),
    "zb-h1 at pp 1": (GPT, MOCK + ["--pipeline-schedule", "zb-h1"], "--pipeline-schedule zb-h1"),
    "plan gpu memory -1": (PLAN, TINY_MODEL + ["--gpu-memory-gb", "-1"], "--gpu-memory-gb"),
    "plan network 0": (PLAN, TINY_MODEL + ["--network-gbps", "0"], "--network-gbps"),
    "plan nvlink 0": (PLAN, TINY_MODEL + ["--nvlink-gbps", "0"], "--nvlink-gbps"),
    "plan top -1": (PLAN, TINY_MODEL + ["--top", "-1"], "--top"),
    "checkpoint args without a checkpoint": (GPT, MOCK + ["--use-checkpoint-args"], "--use-checkpoint-args"),
    # issue 41: the planner named no flag ("no valid layout"), a traceback, a "best" command where nothing fits
    "plan layers 0": (PLAN, TINY_MODEL + ["--global-batch-size", "4", "--num-layers", "0"], "--num-layers"),
    "plan hidden too large": (PLAN, TINY_MODEL[:2] + ["--hidden-size", "4000000000", "--num-attention-heads", "1",
                                                      "--global-batch-size", "4"], "storage size overflows"),
    "plan nothing fits": (PLAN, TINY_MODEL + ["--global-batch-size", "2", "--num-layers", "1", "--num-gpus", "1",
                                              "--gpus-per-node", "1", "--gpu-memory-gb", "1e-6"], "no layout fits"),
    "finetune into its own load dir": (GPT, MOCK + ["--finetune", "--load", "{d}/folder", "--save", "{d}/folder/"],
                                       "give another --save"),
    "moe index files garbage": (GPT, MOE + ["--load", "{d}/moeidx"], "moeidx/iter_0000001/index/"),
    "convert mixtral missing expert": (CONVERT, ["--loader", "hf", "--saver", "megatron", "--load-dir",
                                                 "{d}/mixtral-drop", "--save-dir", "{d}/out/c"], "experts.1.w2.weight"),
    "convert mixtral config names more experts": (CONVERT, ["--loader", "hf", "--saver", "megatron", "--load-dir",
                                                            "{d}/mixtral-more", "--save-dir", "{d}/out/c"],
                                                  "experts.2.w1.weight"),
    "convert qwen2-moe missing expert": (CONVERT, ["--loader", "hf", "--saver", "megatron", "--load-dir",
                                                   "{d}/qwen-drop", "--save-dir", "{d}/out/c"], "experts.0.up_proj"),
    "convert qwen2-moe config names more experts": (CONVERT, ["--loader", "hf", "--saver", "megatron", "--load-dir",
                                                              "{d}/qwen-more", "--save-dir", "{d}/out/c"],
                                                    "experts.2.gate_proj.weight"),
    "convert damaged bytes to nan": (CONVERT, ["--loader", "hf", "--saver", "megatron", "--load-dir",
                                               "{d}/mixtral-nan", "--save-dir", "{d}/out/c"], "holds NaN or inf"),
    "sentencepiece 2000 on byte data": (GPT, TOKDATA[:-2] + ["--data-path", "{d}/bytes_text_document",
                                        "--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                                        "{d}/sp2000/spm.model"], "bytes_text_document: the data was tokenized with"),
    # issue 43: Muon's flags, and what Muon does not take
    "muon tp mode unknown": (GPT, MOCK + ["--optimizer", "muon", "--muon-tp-mode", "rowwise"], "--muon-tp-mode"),
    "muon coefficients unknown": (GPT, MOCK + ["--optimizer", "muon", "--muon-coefficient-type", "cubic"],
                                  "--muon-coefficient-type"),
    "muon ns steps 0": (GPT, MOCK + ["--optimizer", "muon", "--muon-num-ns-steps", "0"], "--muon-num-ns-steps"),
    "muon ns steps not a multiple": (GPT, MOCK + ["--optimizer", "muon", "--muon-num-ns-steps", "3"],
                                     "multiple of 5 Newton-Schulz steps"),
    "muon cpu offload": (GPT, MOCK + ["--optimizer", "muon", "--optimizer-cpu-offload"],
                         "--optimizer-cpu-offload is not built for --optimizer muon"),
    "muon syrk": (GPT, MOCK + ["--optimizer", "muon", "--muon-use-syrk"], "--muon-use-syrk"),
    "muon lion scalars": (GPT, MOCK + ["--optimizer", "muon", "--muon-scalar-optimizer", "lion"],
                          "--muon-scalar-optimizer lion"),
    "optimizer soap": (GPT, MOCK + ["--optimizer", "soap"], "--optimizer soap is not built"),
    "merge data of two tokenizers": (MERGE, ["--input", "{d}/bytes_text_document", "{d}/sp_text_document",
                                             "--output-prefix", "{d}/out/m"], "--input"),
}


def _write_dataset(prefix, documents, dtype):
    builder = IndexedDatasetBuilder(prefix, dtype)
    for doc in documents:
        builder.add_document(np.asarray(doc), [len(doc)])
    builder.finalize()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The folder of every file the cases name (see the module docstring)."""
    d = tmp_path_factory.mktemp("bad-inputs")
    rng = np.random.default_rng(0)
    docs = [rng.integers(32, 127, size=int(rng.integers(20, 60))) for _ in range(60)]
    _write_dataset(str(d / "good"), docs, np.uint16)
    late = [doc.copy() for doc in docs]
    late[57][3] = 5000  # ByteTokenizer has 257 ids; no early sample reaches this document
    _write_dataset(str(d / "late"), late, np.uint16)
    (d / "in.jsonl").write_text("".join(json.dumps({"text": f"document {i}: some text."}) + "\n" for i in range(20)))
    (d / "empty.jsonl").write_text("")
    (d / "blank.jsonl").write_text("\n   \n\n")
    (d / "bad.jsonl").write_text('{"text": broken}\n[1, 2]\n')
    (d / "junk").write_bytes(bytes(range(256)) * 8)
    (d / "folder").mkdir()
    (d / "badckpt").mkdir()
    (d / "badckpt" / "latest_checkpointed_iteration.txt").write_text("7\n")
    write_garbage_index(str(d / "moeidx"), MOE)
    for name, kind, config_experts, drop in (
            ("mixtral-drop", "mixtral", 2, "model.layers.0.block_sparse_moe.experts.1.w2.weight"),
            ("mixtral-more", "mixtral", 4, None),
            ("qwen-drop", "qwen2_moe", 2, "model.layers.0.mlp.experts.0.up_proj.weight"),
            ("qwen-more", "qwen2_moe", 3, None)):
        write_hf_moe(str(d / name), kind, config_experts, drop)
    write_hf_moe(str(d / "mixtral-nan"), "mixtral", damage=True)
    write_byte_data_and_sentencepiece(str(d))
    return d


def _args(args, d):
    return [a.replace("{d}", str(d)) for a in args]


def _env(d):
    return {"XDG_CACHE_HOME": str(d / "cache")}  # index caches go to the test's folder, not the user's ~/.cache


def run_case(script, args, d, nproc=1):
    return run_cli(_args(args, d), nproc=nproc, script=script, check=False, timeout=300, env=_env(d))


@pytest.fixture(scope="module")
def one_process_results(request, files):
    """{case: CompletedProcess} of the CASES this session selected, all run from one Python start
    (forked.py: a child per case, as `python script args`), with run_cli's pinned flags and environment."""
    # this module's cases only (tests/unit/test_tiktokenizer.py has a test of the same name, unparametrised)
    chosen = [item.callspec.params["case"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_bad_input_is_one_line" and item.module is request.module]
    cases = [(CASES[c][0], (PINNED if CASES[c][0] in (GPT, BERT) else []) + _args(CASES[c][1], files))
             for c in chosen]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **_env(files))
    proc = subprocess.run([sys.executable, "-m", "tests.functional.forked"], input=json.dumps(cases), cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60 + 30 * len(cases))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    return {c: subprocess.CompletedProcess(args, **r) for c, (_, args), r in zip(chosen, cases, results)}


def assert_one_error_line(proc, expected, torchrun=False, ran=False):
    """Exit 2 (torchrun: its own non-zero), one `error:` line holding expected, no traceback, no iteration
    (unless `ran`: a fault after training started, e.g. at a save)."""
    assert proc.returncode == (2 if not torchrun else proc.returncode) and proc.returncode != 0, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert expected in errors[0], errors[0]
    output = proc.stdout + proc.stderr
    # torchrun's launcher reports a failed child with its own traceback (ChildFailedError); no rank may
    if torchrun:
        assert output.count("Traceback") <= output.count("ChildFailedError"), output[-4000:]
        assert "[rank" not in output, output[-4000:]
    else:
        assert "Traceback" not in output, output[-4000:]
    # no progress line (" iteration N/M | ..."): the start-up lines may name iterations (the rerun check's does)
    assert ran or not re.search(r"^ iteration +\d+/", proc.stdout, re.M), proc.stdout[-2000:]


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line(one_process_results, case):
    assert_one_error_line(one_process_results[case], CASES[case][2])


def test_refused_preprocess_writes_nothing(files):
    for case in ("preprocess empty input", "preprocess blank lines", "preprocess only malformed"):
        run_case(*CASES[case][:2], files)
    assert not (files / "out").exists() or not list((files / "out").iterdir())


TORCHRUN_CASES = {
    "lr nan": (GPT, MOCK + ["--lr", "nan"], "--lr"),
    "save under /proc": (GPT, MOCK + ["--save", "/proc/megatron-ckpt"], "--save"),
}


@pytest.mark.parametrize("case", list(TORCHRUN_CASES))
def test_bad_input_under_torchrun_is_printed_once(files, case):
    script, args, expected = TORCHRUN_CASES[case]
    assert_one_error_line(run_case(script, args, files, nproc=2), expected, torchrun=True)


def test_the_estimators_docstring_example_runs():
    """tools/estimate_memory.py's own example (its docstring's command, as printed) exits 0 with a total."""
    with open(os.path.join(REPO, ESTIMATE)) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    command = re.search(r"python tools/estimate_memory\.py (.*?)\n\n", doc, re.S).group(1)
    proc = run_cli(command.replace("\\\n", " ").split(), script=ESTIMATE)
    assert "stage 0 (24 layers)" in proc.stdout and "total" in proc.stdout


def test_a_model_larger_than_the_memory_limit_is_one_line_saying_what_and_how_much():
    """--hidden-size 100000 under a 4 GiB address-space limit (RLIMIT_AS, set in the child): the first
    layer's 120 GB allocation fails; the line names what was being built and its parameters' memory."""
    limit = 4 << 30
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = PINNED + MOCK + ["--hidden-size", "100000"]
    proc = subprocess.run([sys.executable, GPT] + args, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    h = 100000  # one layer 12 h^2 + 13 h, embeddings (128 padded ids, 16 positions), final LayerNorm 2 h
    n = 12 * h * h + 13 * h + 128 * h + 16 * h + 2 * h
    assert_one_error_line(proc, f"out of memory building the model on rank 0: its {n:,} parameters need "
                                f"{n * 4 / 2 ** 30:,.1f} GiB as float32")
    assert "--hidden-size" in proc.stderr


# activations past a 4 GiB address-space limit: the unfused scores of a 4096-token sequence at micro batch 64
# need 8 GiB ([64, 2, 4096, 4096] fp32); at micro batch 1, 128 MiB
BIG_ACTIVATIONS = MOCK + ["--seq-length", "4096", "--max-position-embeddings", "4096", "--attention-backend", "unfused"]


def _limited(limit):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _tree(path):
    """{relative path: bytes} of every file under path."""
    return {os.path.relpath(os.path.join(d, f), path): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(path) for f in names}


def test_activations_past_the_memory_limit_are_one_line_and_keep_the_checkpoints(files, tmp_path):
    """A run saved at iteration 2 resumes with --micro-batch-size 64 under a 4 GiB address-space limit: the
    attention scores of iteration 3 fail to allocate; one line names the iteration, the estimator's figure and
    the flags that help, exit 2, and the checkpoint directory is byte for byte what the first run left."""
    save = tmp_path / "ckpt"
    args = PINNED + BIG_ACTIVATIONS + ["--save", str(save), "--save-interval", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **_env(files))
    first = subprocess.run([sys.executable, GPT] + args + ["--micro-batch-size", "1"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = _tree(save)
    proc = subprocess.run([sys.executable, GPT] + args + ["--load", str(save), "--micro-batch-size", "64",
                                                          "--train-iters", "4"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, preexec_fn=_limited(4 << 30))
    assert_one_error_line(proc, "out of memory in iteration 3 on rank 0 (an allocation of 8.0 GiB failed; the "
                                "estimated peak of this rank is ", ran=True)
    assert "--micro-batch-size" in proc.stderr and "--recompute-granularity" in proc.stderr
    assert _tree(save) == saved


def test_activations_past_the_memory_limit_under_torchrun_are_printed_once(files):
    """Both ranks of a DP2 world run out of memory in iteration 1: the line is printed once."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **_env(files))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           GPT] + PINNED + BIG_ACTIVATIONS + ["--micro-batch-size", "64"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, preexec_fn=_limited(4 << 30))
    assert_one_error_line(proc, "out of memory in iteration 1 on rank ", torchrun=True)
