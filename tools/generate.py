"""Generate text from a checkpoint (any tensor-parallel size; KV cache; greedy or sampled).

    python tools/generate.py --load ckpt/ --prompt-ids "1 2 3" --max-new-tokens 20
    torchrun --nproc-per-node 2 tools/generate.py --load ckpt/ --tensor-model-parallel-size 2 \
        --prompt "def main(" --temperature 0.8 --top-p 0.9 --max-new-tokens 50

Prompts are token ids, or text through the checkpoint's tokenizer (ByteTokenizer, or
NullTokenizer whose text is space-separated ids). Prints the generated ids and text.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

from megatron.core.checkpointing import find_checkpoint, read_metadata
from megatron.core.config import ConfigError
from megatron.core.errors import MegatronUserError
from megatron.core.inference.generation import generate, load_model
from megatron.core.parallel_state import ParallelConfigError, initialize_model_parallel
from megatron.training.tokenizer import ByteTokenizer, NullTokenizer


def tokenizer_of(metadata):
    t = metadata["args"].get("training", {})
    if t.get("tokenizer_type") == "ByteTokenizer":
        return ByteTokenizer()
    return NullTokenizer(t.get("vocab_size") or metadata["args"]["model"]["vocab_size"])


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", required=True, help="checkpoint directory")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="space-separated token ids")
    prompt.add_argument("--prompt", help="text, tokenised with the checkpoint's tokenizer")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--inference-max-seq-length", type=int, default=None,
                   help="longest prompt + generated tokens (default: the checkpoint's, 2560)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding (default unless sampling flags are given)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--stop-at-eod", action="store_true", help="stop once the tokenizer's end-of-document appears")
    return p.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    try:
        metadata = read_metadata(find_checkpoint(a.load))
        if a.max_new_tokens < 0 or (a.temperature is not None and a.temperature <= 0) or not 0 < a.top_p <= 1:
            raise ConfigError("need --max-new-tokens >= 0, --temperature > 0 and 0 < --top-p <= 1")
        if "RANK" not in os.environ:
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
        if dist.get_world_size() != a.tensor_model_parallel_size:
            raise ParallelConfigError(f"launch exactly --tensor-model-parallel-size "
                                      f"({a.tensor_model_parallel_size}) processes, got {dist.get_world_size()}")
        groups = initialize_model_parallel(a.tensor_model_parallel_size, 1)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
            if torch.cuda.is_available() else torch.device("cpu")
        model, config, _ = load_model(a.load, groups, device)
    except MegatronUserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tok = tokenizer_of(metadata)
    ids = [int(t) for t in a.prompt_ids.split()] if a.prompt_ids is not None else tok.tokenize(a.prompt)
    if not ids or max(ids) >= config.vocab_size or min(ids) < 0:
        print(f"error: the prompt needs token ids in [0, {config.vocab_size})", file=sys.stderr)
        return 2
    limit = a.inference_max_seq_length or metadata["args"].get("training", {}).get("inference_max_seq_length") or 2560
    if len(ids) + a.max_new_tokens > limit:
        print(f"error: prompt ({len(ids)} tokens) + --max-new-tokens ({a.max_new_tokens}) exceeds "
              f"--inference-max-seq-length ({limit}); raise it or ask for fewer tokens", file=sys.stderr)
        return 2
    sampling = a.temperature is not None or a.top_k > 0 or a.top_p < 1.0
    out = generate(model, torch.tensor([ids], device=device), a.max_new_tokens, greedy=a.greedy or not sampling,
                   temperature=a.temperature or 1.0, top_k=a.top_k, top_p=a.top_p, seed=a.seed,
                   eod=tok.eod if a.stop_at_eod else None)
    new = out[0, len(ids):].tolist()
    if dist.get_rank() == 0:
        print("generated ids: " + " ".join(map(str, new)))
        print("text: " + tok.detokenize(ids + new))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
