"""Autoregressive generation with a KV cache, on any TP size (one pipeline stage).

The cached forward walks the model's own modules (embedding, norms, the TP-split QKV /
projection / MLP layers with their collectives, the vocab-parallel output layer) and only
re-does attention's core, so training code needs no inference branches. Logits are
gathered over the TP group and cut to the real vocabulary; every TP rank samples the
same token (same logits, same seeded generator) and rank 0's is broadcast to be sure.
"""
import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..checkpointing import CheckpointError, CheckpointReader, find_checkpoint, local_shard
from ..config import TransformerConfig
from ..models.gpt import GPTModel
from ..tensor_parallel.mappings import gather_from_tensor_model_parallel_region
from ..tensor_parallel.param_meta import param_meta
from ..transformer.rope import apply_rope, rope_cos_sin


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
    config = config_from_checkpoint(reader.metadata["args"]["model"], groups.tp_size)
    if config.post_norm or reader.has("tokentype_embeddings"):
        raise CheckpointError(f"{load_dir} is not a pre-norm GPT checkpoint (post-norm layers or BERT); "
                              "generation runs GPT models trained without --post-norm")
    if dtype is not None:
        config.params_dtype = dtype
    model = GPTModel(config, groups, device=device)
    for p in model.parameters():
        p.copy_(local_shard(reader.global_tensor(param_meta(p).init_key), p, groups.tp_rank, groups.tp_size))
    model.eval()
    return model, config, reader.metadata


def _attention(attn, x, rope, cache, pos):
    """attn: a SelfAttention; x [s, b, h]; cache: dict with "k", "v" [b, groups/TP, pos, d]."""
    qkv, _ = attn.linear_qkv(x)
    s, b = qkv.shape[:2]
    per = attn.heads // attn.groups
    qkv = qkv.view(s, b, attn.groups, per + 2, attn.head_dim)
    q = qkv[:, :, :, :per].reshape(s, b, attn.heads, attn.head_dim)
    k, v = qkv[:, :, :, per], qkv[:, :, :, per + 1]
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
    if "k" in cache:
        k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
    cache["k"], cache["v"] = k, v
    # query i (absolute position pos + i) sees keys 0 .. pos + i
    mask = torch.arange(pos + s, device=x.device)[None, :] <= (pos + torch.arange(s, device=x.device))[:, None]
    kwargs = {"enable_gqa": True} if attn.groups != attn.heads else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    return attn.linear_proj(out.permute(2, 0, 1, 3).reshape(s, b, attn.heads * attn.head_dim))[0]


@torch.no_grad()
def forward_with_cache(model, ids, caches, pos):
    """ids [b, s] at absolute positions pos..pos+s-1 -> logits [b, s, vocab] (fp32, whole
    real vocabulary). caches: one dict per layer, extended in place."""
    c = model.config
    s = ids.shape[1]
    x = model.word_embeddings(ids.t())
    if c.position_embedding_type == "learned_absolute":
        x = x + model.position_embeddings[pos:pos + s].unsqueeze(1)
    rope = None
    if c.position_embedding_type == "rope":
        cos, sin = rope_cos_sin(pos + s, c.kv_channels, c.rotary_base, x.device, x.dtype)
        rope = (cos[pos:], sin[pos:])
    for layer, cache in zip(model.decoder.layers, caches):
        x = x + _attention(layer.self_attention, layer.input_layernorm(x), rope, cache, pos)
        x = x + layer.mlp(layer.pre_mlp_layernorm(x))
    logits = model.logits(model.decoder.final_layernorm(x))
    logits = gather_from_tensor_model_parallel_region(logits, model.groups.tp)
    return logits[..., :c.vocab_size].transpose(0, 1).float()


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
    c = model.config
    if prompt_ids.shape[1] + max_new_tokens > c.max_position_embeddings and c.position_embedding_type != "rope":
        raise ValueError(f"prompt + --max-new-tokens ({prompt_ids.shape[1] + max_new_tokens}) exceeds "
                         f"the model's {c.max_position_embeddings} positions")
    gen = torch.Generator(device=prompt_ids.device).manual_seed(seed)
    caches = [{} for _ in model.decoder.layers]
    out, pos, step_ids = prompt_ids, 0, prompt_ids
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    tp = model.groups.tp
    for _ in range(max_new_tokens):
        logits = forward_with_cache(model, step_ids, caches, pos)[:, -1]
        pos += step_ids.shape[1]
        nxt = sample(logits, greedy, temperature, top_k, top_p, gen)
        if dist.get_world_size(tp) > 1:
            dist.broadcast(nxt, src=dist.get_global_rank(tp, 0), group=tp)
        out = torch.cat([out, nxt[:, None]], dim=1)
        step_ids = nxt[:, None]
        if eod is not None:
            done |= nxt == eod
            if bool(done.all()):
                break
    return out
