"""Autoregressive generation with a KV cache, on any TP size (one pipeline stage).

Every step is the model's own forward (GPTModel.forward with a KVCache): the prompt first,
then one token at a time attending over the cached keys and values, so any GPT the trainer
builds generates (learned or rotary positions, GQA, SwiGLU, RMSNorm, untied output, pre- or
post-norm). BERT is an encoder with no next-token head, so it is refused. Logits are
gathered over the TP group and cut to the real vocabulary; every TP rank samples the same
token (same logits, same seeded generator) and rank 0's is broadcast to be sure.
"""
import dataclasses

import torch
import torch.distributed as dist

from .. import comm
from ..checkpointing import CheckpointError, CheckpointReader, find_checkpoint, local_shard
from ..config import TransformerConfig
from ..models.gpt import GPTModel
from ..tensor_parallel.mappings import gather_from_tensor_model_parallel_region
from ..tensor_parallel.param_meta import param_meta
from ..transformer.kv_cache import KVCache


def config_from_checkpoint(args, tp):
    """TransformerConfig for inference at TP size `tp` from a checkpoint's model args."""
    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {k: v for k, v in args.items() if k in names and k != "params_dtype"}
    kw.update(tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
              virtual_pipeline_model_parallel_size=None, sequence_parallel=False,
              hidden_dropout=0.0, attention_dropout=0.0)
    config = TransformerConfig(**kw)
    config.params_dtype = getattr(torch, str(args.get("params_dtype", "torch.float32")).split(".")[-1])
    config.validate()
    return config


@torch.no_grad()
def load_model(load_dir, groups, device, dtype=None):
    """(model, config, checkpoint metadata): a GPTModel with this TP rank's shards of the
    checkpoint's weights. dtype overrides the saved parameter dtype (e.g. torch.float32)."""
    reader = CheckpointReader(find_checkpoint(load_dir))
    if reader.has("tokentype_embeddings"):  # by design: an encoder has no next-token head to decode with
        raise CheckpointError(f"{load_dir} holds a BERT model; generation runs GPT checkpoints only")
    config = config_from_checkpoint(reader.metadata["args"]["model"], groups.tp_size)
    if dtype is not None:
        config.params_dtype = dtype
    model = GPTModel(config, groups, device=device)
    for p in model.parameters():
        p.copy_(local_shard(reader.global_tensor(param_meta(p).init_key), p, groups.tp_rank, groups.tp_size))
    model.eval()
    return model, config, reader.metadata


@torch.no_grad()
def forward_with_cache(model, ids, kv_cache):
    """ids [b, s], the tokens after those in kv_cache (a KVCache, extended in place) ->
    logits [b, s, vocab] (fp32, the whole real vocabulary). All-gathers over `model.groups.tp`."""
    logits = gather_from_tensor_model_parallel_region(model(ids, kv_cache=kv_cache), model.groups.tp)
    return logits[..., :model.config.vocab_size].float()


def sample(logits, greedy=True, temperature=1.0, top_k=0, top_p=1.0, generator=None):
    """logits [b, V] -> token ids [b]. Greedy, or softmax(logits / temperature) restricted
    to the top_k tokens and/or the smallest set with probability >= top_p."""
    if greedy:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs > top_p  # keep the token that crosses top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, greedy=True, temperature=1.0, top_k=0, top_p=1.0,
             seed=0, eod=None):
    """prompt_ids [b, s] (same length) -> [b, s + n] with n <= max_new_tokens new tokens
    (stops early when every sequence has produced `eod`, if given)."""
    if not isinstance(model, GPTModel):
        raise TypeError(f"generation runs a GPTModel, not a {type(model).__name__} (BERT has no next-token head)")
    config = model.config
    total = prompt_ids.shape[1] + max_new_tokens
    if total > config.max_position_embeddings and config.position_embedding_type != "rope":
        raise ValueError(f"prompt + --max-new-tokens ({total}) exceeds "
                         f"the model's {config.max_position_embeddings} positions")
    gen = torch.Generator(device=prompt_ids.device).manual_seed(seed)
    kv_cache = KVCache()
    out, step_ids = prompt_ids, prompt_ids
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    tp = model.groups.tp
    for _ in range(max_new_tokens):
        logits = forward_with_cache(model, step_ids, kv_cache)[:, -1]
        nxt = sample(logits, greedy, temperature, top_k, top_p, gen)
        if comm.world(tp) > 1:
            dist.broadcast(nxt, src=dist.get_global_rank(tp, 0), group=tp)
        out = torch.cat([out, nxt[:, None]], dim=1)
        step_ids = nxt[:, None]
        if eod is not None:
            done |= nxt == eod
            if bool(done.all()):
                break
    return out
