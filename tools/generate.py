"""Generate text from a checkpoint (any tensor- and pipeline-parallel size; KV cache; greedy or sampled).

    python tools/generate.py --load ckpt/ --prompt "def main(" --max-new-tokens 20
    python tools/generate.py --load ckpt/ --prompt-file prompts.txt    # one prompt a line, outputs in order
    torchrun --nproc-per-node 4 tools/generate.py --load ckpt/ --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2 --prompt "def main(" --temperature 0.8 --top-p 0.9
    torchrun --nproc-per-node 2 tools/generate.py --load moe_ckpt/ --expert-model-parallel-size 2 --prompt "x"

Text goes through the tokenizer the checkpoint was trained with (its saved tokenizer flags:
SentencePiece, GPT2BPE, HuggingFace, Byte or Null; its files must still be where training
found them); --prompt-ids gives token ids directly. Generation stops at that tokenizer's
end-of-document (unless --no-stop-at-eod), and prompt + --max-new-tokens must fit the
positions the model was trained for. Prints the generated ids and text of each prompt.
"""
import argparse
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

from megatron.core.checkpointing import find_checkpoint, read_metadata
from megatron.core.errors import ConfigError, MegatronUserError, ParallelConfigError, TokenizerError
from megatron.core.inference.generation import generate, load_model
from megatron.core.parallel_layout import ParallelLayout
from megatron.core.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check_ranges
from megatron.training.tokenizer import build_tokenizer
from megatron.training.tokenizer.simple import NullTokenizer
from tools.tool_args import ToolParser

_FILE_FLAGS = ("vocab_file", "merge_file", "tokenizer_model")
# each sampling flag's own rule, so the error names the one that fails (None: not given)
SAMPLING_RULES = {"max_new_tokens": NON_NEGATIVE, "temperature": POSITIVE, "top_k": NON_NEGATIVE,
                  "top_p": ("(]", 0, 1), "inference_max_seq_length": AT_LEAST_ONE, "seed": ("[]", 0, 2 ** 63 - 1)}


def tokenizer_of(metadata):
    """The tokenizer the checkpoint was trained with, from its saved training args (a
    NullTokenizer's --vocab-size is `null_vocab_size`, `vocab_size` in older checkpoints)."""
    t = metadata["args"].get("training", {})
    kind = t.get("tokenizer_type") or "NullTokenizer"
    if kind.startswith("BertWordPiece"):
        raise TokenizerError(f"the checkpoint was trained with {kind}, a BERT tokenizer; "
                             "generation runs GPT checkpoints only")
    null = t.get("null_vocab_size") or t.get("vocab_size") or metadata["args"]["model"]["vocab_size"]
    flags = SimpleNamespace(tokenizer_type=kind, null_vocab_size=null, **{f: t.get(f) for f in _FILE_FLAGS})
    try:
        return build_tokenizer(flags)
    except TokenizerError as e:
        raise TokenizerError(f"the checkpoint's tokenizer ({kind}, from its training flags): {e}") from None


def prompts_of(a, tok):
    """[[token id, ...], ...] from --prompt-ids, --prompt or --prompt-file (one prompt a line)."""
    if a.prompt_ids is not None:
        try:
            return [[int(t) for t in a.prompt_ids.split()]]
        except ValueError:
            raise ConfigError(f"--prompt-ids {a.prompt_ids!r}: give space-separated integers") from None
    if a.prompt is not None:
        return [_text(tok, a.prompt, "--prompt")]
    try:
        with open(a.prompt_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--prompt-file {a.prompt_file}: {e}") from None
    if not lines:
        raise ConfigError(f"--prompt-file {a.prompt_file} is empty; write one prompt per line")
    return [_text(tok, line, f"--prompt-file {a.prompt_file} line {i + 1}") for i, line in enumerate(lines)]


def _text(tok, text, where):
    """The ids of a text prompt; a checkpoint trained without a text tokenizer (NullTokenizer: its text is the
    ids themselves, as in Megatron-LM) takes only whitespace-separated integers."""
    if isinstance(tok, NullTokenizer) and not all(t.lstrip("-").isdigit() for t in text.split()):
        raise ConfigError(f"{where}: the checkpoint was trained with NullTokenizer (no text tokenizer: its text is "
                          "whitespace-separated token ids); give ids (--prompt-ids '1 2 3') or a checkpoint trained "
                          "with a text tokenizer")
    return tok.tokenize(text)


def parse(argv):
    p = ToolParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", required=True, help="checkpoint directory")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                   help="stages, each holding its share of the layers (launch TP x PP x EP processes)")
    p.add_argument("--expert-model-parallel-size", type=int, default=1,
                   help="MoE checkpoints: experts split over this many ranks, each rank running every prompt")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="space-separated token ids")
    prompt.add_argument("--prompt", help="text, tokenised with the checkpoint's tokenizer")
    prompt.add_argument("--prompt-file", help="a text file of prompts, one per line; outputs come in the same order")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--inference-max-seq-length", type=int, default=None,
                   help="longest prompt + generated tokens (default: the checkpoint's, 2560)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding (default unless sampling flags are given)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--stop-at-eod", action=argparse.BooleanOptionalAction, default=True,
                   help="stop once the tokenizer's end-of-document appears (default: yes)")
    return p.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    try:
        return _run(a)
    except MegatronUserError as e:
        if os.environ.get("RANK", "0") == "0":  # once under torchrun
            print(f"error: {e}", file=sys.stderr)
        return 2


def _run(a):
    check_ranges(a, SAMPLING_RULES, lambda name: "--" + name.replace("_", "-"))
    metadata = read_metadata(find_checkpoint(a.load))
    tok = tokenizer_of(metadata)
    prompts = prompts_of(a, tok)
    vocab = metadata["args"]["model"]["vocab_size"]
    for i, ids in enumerate(prompts):
        if not ids or max(ids) >= vocab or min(ids) < 0:
            raise ConfigError(f"prompt {i + 1}: needs at least one token, with ids in [0, {vocab})")
    limit = a.inference_max_seq_length or metadata["args"].get("training", {}).get("inference_max_seq_length")
    for i, ids in enumerate(prompts):
        if limit and len(ids) + a.max_new_tokens > limit:
            raise ConfigError(f"prompt {i + 1} ({len(ids)} tokens) + --max-new-tokens ({a.max_new_tokens}) exceeds "
                              f"--inference-max-seq-length ({limit}); raise it or ask for fewer tokens")
    tp, pp, ep = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.expert_model_parallel_size
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    layout = _layout(int(os.environ["WORLD_SIZE"]), tp, pp, ep)
    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    try:
        groups = layout.build_groups()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
            if torch.cuda.is_available() else torch.device("cpu")
        model, _, _ = load_model(a.load, groups, device)
        sampling = a.temperature is not None or a.top_k > 0 or a.top_p < 1.0
        for ids in prompts:
            out = generate(model, torch.tensor([ids], device=device), a.max_new_tokens,
                           greedy=a.greedy or not sampling, temperature=a.temperature or 1.0, top_k=a.top_k,
                           top_p=a.top_p, seed=a.seed, eod=tok.eod if a.stop_at_eod else None)
            new = out[0, len(ids):].tolist()
            if dist.get_rank() == 0:
                print("generated ids: " + " ".join(map(str, new)))
                print("text: " + tok.detokenize(ids + new), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


def _layout(world, tp, pp, ep) -> ParallelLayout:
    """The layout generation runs on: every rank runs the same prompts, so a data-parallel rank is there only to
    hold other experts (expert-DP 1: the EP ranks are the data-parallel ones). ParallelConfigError otherwise."""
    try:
        layout = ParallelLayout(world, tp, pp=pp, ep=ep)
    except ParallelConfigError:
        layout = None
    if layout is None or layout.edp != 1:
        raise ParallelConfigError(f"launch exactly --tensor-model-parallel-size x --pipeline-model-parallel-size x "
                                  f"--expert-model-parallel-size ({tp} x {pp} x {ep}) processes, got {world}")
    return layout


if __name__ == "__main__":
    sys.exit(main())
