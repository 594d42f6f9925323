"""Autoregressive generation with a KV cache, on any TP and PP size.

Every step is the model's own forward (GPTModel.forward with a KVCache): the prompt first,
then one token at a time attending over the cached keys and values, so any GPT the trainer
builds generates (learned or rotary positions, GQA, SwiGLU, RMSNorm, untied output, pre- or
post-norm). BERT is an encoder with no next-token head, so it is refused. Logits are
gathered over the TP group and cut to the real vocabulary; every TP rank samples the same
token (same logits, same seeded generator) and rank 0's is broadcast to be sure.

With pipeline stages each stage holds its own layers and its own KVCache; every step, the
hidden states [s, b, h] go stage to stage with the training p2p (P2PCommunicator), the last
stage samples, and the token is broadcast over the pipeline group so that every stage
feeds the same ids (the first to its embedding, all to their rotary positions) next step.
"""
import dataclasses

import torch
import torch.distributed as dist

from .. import comm
from ..checkpointing import CheckpointError, CheckpointReader, find_checkpoint, local_shard
from ..config import TransformerConfig
from ..errors import ConfigError
from ..models.gpt import GPTModel
from ..pipeline_parallel.p2p import P2PCommunicator
from ..tensor_parallel.mappings import gather_from_tensor_model_parallel_region
from ..tensor_parallel.param_meta import param_meta
from ..transformer.kv_cache import KVCache
from ..transformer.model_state import non_trained_state


def config_from_checkpoint(args, tp, pp=1, ep=1):
    """TransformerConfig for inference at TP size `tp`, PP size `pp` (layers split evenly) and, for
    MoE, expert-parallel size `ep` (experts split over TP like the dense MLP) from a checkpoint's model args."""
    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {k: v for k, v in args.items() if k in names and k != "params_dtype"}
    kw.update(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
              virtual_pipeline_model_parallel_size=None, num_layers_per_virtual_pipeline_stage=None,
              decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None, sequence_parallel=False,
              hidden_dropout=0.0, attention_dropout=0.0)
    # the training run's EP and expert TP are layout, not model: experts split over TP like the dense MLP
    # (no folded expert grid here: one decoding step may hold fewer tokens than TP ranks)
    kw["expert_tensor_parallel_size"] = None
    if args.get("num_experts"):
        kw["expert_model_parallel_size"] = ep
    elif ep > 1:
        raise ConfigError("--expert-model-parallel-size: the checkpoint is a dense model (no experts); leave it out")
    config = TransformerConfig(**kw)
    config.params_dtype = getattr(torch, str(args.get("params_dtype", "torch.float32")).split(".")[-1])
    config.validate()
    return config


@torch.no_grad()
def load_model(load_dir, groups, device, dtype=None):
    """(model, config, checkpoint metadata): a GPTModel of this pipeline stage's layers with
    this TP rank's shards of the checkpoint's weights (an MoE layer's: this EP rank's experts,
    groups.ep_size of them splitting the experts). dtype overrides the saved parameter dtype
    (e.g. torch.float32)."""
    reader = CheckpointReader(find_checkpoint(load_dir))
    if reader.has("tokentype_embeddings"):  # by design: an encoder has no next-token head to decode with
        raise CheckpointError(f"{load_dir} holds a BERT model; generation runs GPT checkpoints only")
    config = config_from_checkpoint(reader.metadata["args"]["model"], groups.tp_size, groups.pp_size,
                                    groups.ep_size)
    if dtype is not None:
        config.params_dtype = dtype
    model = GPTModel(config, groups, pre_process=groups.is_first_stage, post_process=groups.is_last_stage,
                     device=device)
    for p in model.parameters():
        p.copy_(local_shard(reader.global_tensor(param_meta(p).init_key), p, groups.tp_rank, groups.tp_size))
    for key, t in non_trained_state(model):  # the MoE expert bias; absent from older checkpoints: stays 0
        if reader.has(key, "buffer"):
            t.copy_(reader.global_tensor(key, "buffer"))
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


def position_limit(config):
    """Tokens a sequence may hold: the learned position table, or for rope the trained --seq-length."""
    if config.position_embedding_type == "rope":
        return config.seq_length, "rope: the --seq-length it was trained with"
    return config.max_position_embeddings, "its learned position table, --max-position-embeddings"


@torch.no_grad()
def stage_forward(model, ids, kv_cache):
    """One step of this pipeline stage: ids [b, s] (on every stage) -> logits [b, s, vocab] on
    the last stage, None elsewhere. Hidden states [s, b, h] come from the previous stage and go
    to the next over `model.groups.pp` (p2p); TP collectives over `model.groups.tp`."""
    groups = model.groups
    if groups.pp_size == 1:
        return forward_with_cache(model, ids, kv_cache)
    shape = (ids.shape[1], ids.shape[0], model.config.hidden_size)
    p2p = P2PCommunicator(groups, shape, model.config.params_dtype, ids.device)
    if not groups.is_first_stage:
        hidden = p2p.buffer()
        p2p.exchange([("recv", hidden, groups.pp_rank - 1)])
        model.set_input_tensor(hidden)
    if groups.is_last_stage:
        return forward_with_cache(model, ids, kv_cache)
    p2p.exchange([("send", model(ids, kv_cache=kv_cache), groups.pp_rank + 1)])
    return None


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, greedy=True, temperature=1.0, top_k=0, top_p=1.0,
             seed=0, eod=None):
    """prompt_ids [b, s] (same length, on every rank) -> [b, s + n] with n <= max_new_tokens
    new tokens (stops early when every sequence has produced `eod`, if given). Every rank of
    the TP x PP grid calls it and gets the same result."""
    if not isinstance(model, GPTModel):
        raise TypeError(f"generation runs a GPTModel, not a {type(model).__name__} (BERT has no next-token head)")
    total = prompt_ids.shape[1] + max_new_tokens
    limit, what = position_limit(model.config)
    if total > limit:
        raise ConfigError(f"prompt ({prompt_ids.shape[1]} tokens) + --max-new-tokens ({max_new_tokens}) = {total} "
                          f"exceeds the model's {limit} positions ({what}); shorten one of them")
    gen = torch.Generator(device=prompt_ids.device).manual_seed(seed)
    kv_cache = KVCache()
    out, step_ids = prompt_ids, prompt_ids
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    groups = model.groups
    for _ in range(max_new_tokens):
        logits = stage_forward(model, step_ids, kv_cache)
        if logits is not None:
            nxt = sample(logits[:, -1], greedy, temperature, top_k, top_p, gen)
            if comm.world(groups.tp) > 1:
                dist.broadcast(nxt, src=dist.get_global_rank(groups.tp, 0), group=groups.tp)
        else:
            nxt = torch.empty(prompt_ids.shape[0], dtype=torch.long, device=prompt_ids.device)
        if groups.pp_size > 1:  # the last stage's token to every stage
            dist.broadcast(nxt, src=groups.pp_ranks[-1], group=groups.pp)
        out = torch.cat([out, nxt[:, None]], dim=1)
        step_ids = nxt[:, None]
        if eod is not None:
            done |= nxt == eod
            if bool(done.all()):
                break
    return out
