"""Multi-latent attention (transformer/mla.py) on paper: its GEMMs, the activations it keeps and its TP
collectives, each in place of standard attention's (cost.layer_costs, activations.py, traffic.layer_collectives).

Per token, with n heads, query head dq = qk + dr, value head dv, core head d = max(dq, dv) (the shorter of
q / k and v is zero-padded to it), latents rq (query, absent without --q-lora-rank) and rkv:
- GEMMs: query down [h -> rq] and up [rq -> n dq / t] (or one [h -> n dq / t]), KV down [h -> rkv + dr],
  KV up [rkv -> n (qk + dv) / t], output [n dv / t -> h], and the core's scores and values at head size d.
  The down-projections are replicated over TP: with SP they run on this rank's s / t tokens, without it on all.
- Saved activations (the attention module, as autograd keeps them; tests/unit/test_mla_planner.py measures it):
      input                    h                   (shared by the down-projections and the query projection)
      query latent             rq, and rq more with --qk-layernorm (the norm's input and output)
      KV down output           rkv + dr (the norm, or the up-projection, keeps a view of the whole output),
                               and rkv more with --qk-layernorm (the norm's output)
      q, k                     n d each (after the rotary join and the padding)
      v                        n d when padded, else a view of the KV up output: n (qk + dv)
      output projection input  n dv
      scores                   as standard attention (softmax output, dropout mask and output over n heads)
  The latents follow the input (/ t with SP; whole on every rank without it); the per-head terms are / t.
  The norms' own statistics are left out, as Korthikanti et al. leave out LayerNorm's.
- TP collectives: the up-projections gather (SP) or all-reduce the gradients of (no SP) their inputs, the
  query latent (or h) and the KV latent, and the rotary key (dr) the same way; the output projection is
  standard attention's. --recompute-modules mla_up_proj gathers the latents again in the backward (SP).
"""
from ...core.parallel_layout import sequence_split
from ...core.transformer.model_options import recomputes
from .hardware import Cluster, gemm_time


def _dims(c):
    n, dq, dv = c.num_attention_heads, c.qk_head_dim + c.qk_pos_emb_head_dim, c.v_head_dim
    return n, dq, dv, max(dq, dv)


def core_head_dim(c) -> int:
    """The head size the attention core runs at: d of the module docstring (--kv-channels without MLA)."""
    return _dims(c)[3] if c.multi_latent_attention else c.kv_channels


def latent_elements(c) -> int:
    """Saved elements per token that follow the input (/ t with SP): the query latent, the KV down output."""
    ln = 2 if c.qk_layernorm else 1
    query = ln * c.q_lora_rank if c.q_lora_rank is not None else 0
    return query + c.kv_lora_rank + c.qk_pos_emb_head_dim + (c.kv_lora_rank if c.qk_layernorm else 0)


def head_elements(c) -> int:
    """Saved elements per token over all heads (/ t): q, k, v and the output projection's input."""
    n, dq, dv, d = _dims(c)
    v = n * d if dv < d else n * (c.qk_head_dim + dv)
    return 2 * n * d + v + n * dv


def attention_bytes(c, tokens, tp=1, sp=False, act=2, mask_bytes=1) -> float:
    """Bytes the multi-latent attention module keeps for backward on one rank, `tokens` = s b (this CP
    rank's) tokens of one microbatch, activations of `act` bytes, attention dropout masks of mask_bytes."""
    rep = tokens / (tp if sp else 1)
    scores = c.num_attention_heads * c.seq_length // c.context_parallel_size * tokens / tp
    return (act * (rep * (c.hidden_size + latent_elements(c)) + tokens * head_elements(c) / tp)
            + (2 * act + mask_bytes) * scores)


def delta_bytes(c, tokens, tp=1, sp=False) -> float:
    """16-bit bytes MLA keeps beyond standard attention (input h; Q, K, V and the output projection's input
    4 h / t; the same scores): what activations.py adds to Korthikanti et al.'s layer."""
    rep = tokens / (tp if sp else 1)
    return 2 * (rep * latent_elements(c) + tokens * head_elements(c) / tp) - 2 * 4 * tokens * c.hidden_size / tp


def projection_time(c, m, cluster: Cluster, tp) -> float:
    """Seconds of one forward's projection GEMMs over m tokens (this CP rank's s / C x b) on one rank."""
    n, dq, dv, _ = _dims(c)
    h, rkv = c.hidden_size, c.kv_lora_rank
    down = m // tp if sequence_split(c.sequence_parallel, tp) else m  # replicated: the SP shard, or every token
    if c.q_lora_rank is None:
        query = gemm_time(cluster, m, n * dq // tp, h)
    else:
        query = gemm_time(cluster, down, c.q_lora_rank, h) + gemm_time(cluster, m, n * dq // tp, c.q_lora_rank)
    kv = (gemm_time(cluster, down, rkv + c.qk_pos_emb_head_dim, h)
          + gemm_time(cluster, m, n * (c.qk_head_dim + dv) // tp, rkv))
    return query + kv + gemm_time(cluster, m, h, n * dv // tp)


def streamed_elements(c, m, tp) -> float:
    """Elements one forward copies outside the GEMMs: q and k joined with their rotary parts and padded,
    v padded, the output unpadded (read + write each), and the latent norms (read + write)."""
    n, dq, dv, d = _dims(c)
    down = m / tp if sequence_split(c.sequence_parallel, tp) else m
    norms = (c.kv_lora_rank + (c.q_lora_rank or 0)) if c.qk_layernorm else 0
    return 2 * m * (2 * n * d + (n * d if dv < d else 0) + (n * dv if dv < d else 0)) / tp + 2 * down * norms


def collectives(c, x, tp):
    """(forward, backward) TP collectives of the attention part of one layer: x = bytes of this CP rank's
    [s / C, b, h] activations (traffic._act)."""
    per = x / c.hidden_size
    q_in = c.q_lora_rank if c.q_lora_rank is not None else c.hidden_size
    latents = [per * q_in, per * c.kv_lora_rank]
    rope = per * c.qk_pos_emb_head_dim
    if not c.sequence_parallel:
        return [("all_reduce", x)], [("all_reduce", n) for n in latents + [rope]]
    again = [("all_gather", n) for n in latents] if recomputes(c, "mla_up_proj") else []
    forward = [("all_gather", n) for n in latents + [rope]] + [("reduce_scatter", x)]
    backward = [("all_gather", x)] + again + [k for n in latents for k in (("all_gather", n), ("reduce_scatter", n))]
    return forward, backward + [("reduce_scatter", rope)]
