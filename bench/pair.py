"""Ours and a plain PyTorch model of the same shape and weights, built for the benchmarks.

"Ours" is the real thing on a world of one: GPTModel from TransformerConfig over the process
groups of initialize_model_parallel(1, 1), built by megatron/training/loop/training.py's
setup_model_and_optimizer as pretrain() builds it (initialize_parameters, DistributedDataParallel,
MegatronOptimizer with fp32 main weights, the LR schedule), trained by its train_step with a
forward_step like pretrain_gpt.py's. "Plain" is bench/plain_models.py's (or plain_moe_model.py's)
model of the same architecture, given our initial weights, trained by plain_models.plain_step with
torch.optim.AdamW on its own parameters and the same learning-rate schedule.
"""
import dataclasses
import datetime
import math
import os
import socket

import torch
import torch.distributed as dist

from bench import plain_models, plain_moe_model
from megatron.core.config import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import LRScheduler
from megatron.core.parallel_state import initialize_model_parallel
from megatron.core.pipeline_parallel import loss_means
from megatron.core.tensor_parallel.random import model_parallel_seed
from megatron.training.config.training_config import TrainingConfig
from megatron.training.loop.training import setup_model_and_optimizer, train_step
from megatron.training.observability.flops import num_floating_point_operations

ARCHS = ("gpt", "llama", "moe")


@dataclasses.dataclass
class Shape:
    arch: str = "gpt"
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    groups: int | None = None      # key/value head groups (llama); None: one per head
    ffn: int | None = None         # default 4 x hidden
    seq: int = 256
    vocab: int = 4096
    micro_batch: int = 8
    num_micro: int = 1
    experts: int = 8                  # moe only
    topk: int = 2
    aux_loss_coeff: float = 1e-2
    z_loss_coeff: float = 1e-3

    def __post_init__(self):
        self.ffn = self.ffn or 4 * self.hidden
        self.groups = self.groups or self.heads

    def scaled(self, k):
        """Hidden (and ffn, head size), sequence and vocabulary divided by k; heads, layers and batch kept."""
        return dataclasses.replace(self, hidden=self.hidden // k, ffn=self.ffn // k, seq=self.seq // k,
                                   vocab=self.vocab // k)

    @property
    def tokens_per_step(self):
        return self.micro_batch * self.seq * self.num_micro


# the shapes of issue 27's GPU measurements (micro batch 4 x 4 microbatches)
PRESETS = {
    "gpt-1.3b": Shape("gpt", 24, 2048, 16, seq=2048, vocab=50304, micro_batch=4, num_micro=4),
    "llama-1b": Shape("llama", 16, 2048, 32, groups=8, ffn=8192, seq=2048, vocab=50304, micro_batch=4, num_micro=4),
    "moe-seed004": Shape("moe", 6, 384, 8, ffn=1536, seq=1024, vocab=50304, micro_batch=4, num_micro=4),
}


@dataclasses.dataclass
class Hyper:
    lr: float = 1e-3
    min_lr: float = 1e-4
    weight_decay: float = 0.1
    clip_grad: float = 1.0
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    seed: int = 1234
    decay_iters: int = 1000
    warmup_iters: int = 2


def init_world_of_one(device):
    """The default process group of one rank (gloo on CPU, nccl on CUDA) and our rank grid on it."""
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        dist.init_process_group(backend="nccl" if torch.device(device).type == "cuda" else "gloo",
                                timeout=datetime.timedelta(minutes=5))
    return initialize_model_parallel(1, 1)


def ours_config(shape, dtype, torch_ops=False, options=None):
    """TransformerConfig of `shape`; the vocabulary padded to itself (a multiple it divides). options:
    TransformerConfig fields to set (e.g. {"cross_entropy_loss_fusion": True}); the rest keep Megatron-LM's
    defaults (gradient-accumulation fusion on, cross-entropy fusion off), as a user gets them."""
    arch = {"gpt": {}, "llama": dict(position_embedding_type="rope", normalization="RMSNorm", swiglu=True,
                                     group_query_attention=shape.groups != shape.heads,
                                     num_query_groups=shape.groups, add_bias_linear=False,
                                     untie_embeddings_and_output_weights=True),
            "moe": dict(num_experts=shape.experts, moe_router_topk=shape.topk, moe_aux_loss_coeff=shape.aux_loss_coeff,
                        moe_z_loss_coeff=shape.z_loss_coeff, moe_token_dispatcher_type="alltoall",
                        moe_grouped_gemm=True, add_bias_linear=False)}[shape.arch]
    arch.update(options or {})
    if torch_ops:  # every fused-kernel front on its plain torch path
        arch.update(norm_fusion=False, bias_gelu_fusion=False, bias_swiglu_fusion=False, apply_rope_fusion=False,
                    masked_softmax_fusion=False)
    cfg = TransformerConfig(num_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
                            ffn_hidden_size=shape.ffn, seq_length=shape.seq, hidden_dropout=0.0,
                            attention_dropout=0.0, params_dtype=dtype,
                            make_vocab_size_divisible_by=math.gcd(shape.vocab, 128), **arch)
    cfg.vocab_size = shape.vocab
    cfg.validate()
    assert cfg.padded_vocab_size == shape.vocab
    return cfg


def forward_step(model, batch):
    """As pretrain_gpt.py (one stage): -> {"lm loss": (per-token loss [b, s], loss mask [b, s])}."""
    return {"lm loss": (model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"])}


def model_provider(config, groups, device, pre_process=True, post_process=True, vp_stage=None):
    return GPTModel(config, groups, pre_process=pre_process, post_process=post_process, device=device,
                    vp_stage=vp_stage)


class Ours:
    """Built as pretrain() builds it (training.setup_model_and_optimizer), from the configs of `shape`."""

    def __init__(self, shape, groups, device, dtype, hp: Hyper, torch_ops=False, options=None):
        model_parallel_seed(hp.seed, groups.tp_rank, groups.pp_rank, device)
        self.cfg, self.groups = ours_config(shape, dtype, torch_ops, options), groups
        t = TrainingConfig(micro_batch_size=shape.micro_batch, global_batch_size=shape.micro_batch * shape.num_micro,
                           train_iters=hp.decay_iters, lr=hp.lr, min_lr=hp.min_lr, lr_decay_style="cosine",
                           lr_warmup_iters=hp.warmup_iters, weight_decay=hp.weight_decay, clip_grad=hp.clip_grad,
                           adam_beta1=hp.betas[0], adam_beta2=hp.betas[1], adam_eps=hp.eps, seed=hp.seed,
                           bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, loss_scale=1.0)
        self.model, self.ddp, self.opt, self.sched = setup_model_and_optimizer(self.cfg, t, groups, device,
                                                                               model_provider)
        self.iteration = 0
        self.model.train()

    def step(self, batches):
        """One training step -> (lm loss, grad norm) as tensors."""
        self.iteration += 1
        losses, norm, _, _ = train_step(self.model, self.ddp, self.opt, self.sched, batches, forward_step,
                                        self.groups, self.iteration, model_cfg=self.cfg)
        return loss_means(losses)["lm loss"], norm

    def held_tensors(self):
        """What it holds between steps: parameters, gradient buffers, main weights and Adam state."""
        out = list(self.model.parameters()) + [b.grad_data for b in self.ddp.buffers]
        for sp in self.opt.state_pieces():
            out += list(sp.tensors.values())
        return out


class Plain:
    def __init__(self, shape, ours: Ours, device, dtype, hp: Hyper, optim="fused", compile=False):
        torch.manual_seed(hp.seed)
        s = shape
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # built in place (no .to(): it cannot swap fake tensors, op_traffic)
        try:
            with torch.device(device):
                if s.arch == "gpt":
                    self.model, copy = plain_models.PlainGPT(s.vocab, s.seq, s.hidden, s.heads, s.ffn, s.layers), \
                        plain_models.copy_into_gpt
                elif s.arch == "llama":
                    self.model, copy = plain_models.PlainLlama(s.vocab, s.seq, s.hidden, s.heads, s.groups, s.ffn,
                                                               s.layers), plain_models.copy_into_llama
                else:
                    self.model, copy = plain_moe_model.PlainMoEGPT(s), plain_moe_model.copy_into_moe
        finally:
            torch.set_default_dtype(default)
        copy(ours.model, self.model)
        self.opt = plain_models.plain_optimizer(self.model, hp.lr, hp.weight_decay, hp.betas, hp.eps, optim)
        self.sched = LRScheduler(self.opt, hp.lr, hp.min_lr, hp.decay_iters, hp.warmup_iters, "cosine")
        self.clip = hp.clip_grad
        self.forward = torch.compile(self.model) if compile else self.model
        self.model.train()

    def step(self, batches):
        loss, norm = plain_models.plain_step(self.model, self.opt, batches, self.clip, self.forward)
        self.sched.step()
        return loss, norm

    def held_tensors(self):
        out = list(self.model.parameters()) + [p.grad for p in self.model.parameters() if p.grad is not None]
        for state in self.opt.state.values():
            out += [t for t in state.values() if isinstance(t, torch.Tensor)]
        return out


def held_bytes(tensors):
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def option_flags(parser):
    """The command-line flags of ours' options (Megatron-LM's names and defaults) on `parser`."""
    parser.add_argument("--cross-entropy-loss-fusion", action="store_true",
                        help="ours with the fused vocab-parallel cross entropy (Megatron-LM's flag, off by default)")
    parser.add_argument("--no-gradient-accumulation-fusion", action="store_true",
                        help="ours without gradient-accumulation fusion (Megatron-LM's flag; on by default)")


def options(args):
    """TransformerConfig fields from option_flags' parsed `args`: only what differs from the default."""
    out = {}
    if args.cross_entropy_loss_fusion:
        out["cross_entropy_loss_fusion"] = True
    if args.no_gradient_accumulation_fusion:
        out["gradient_accumulation_fusion"] = False
    return out


def make_batches(shape, seed, device):
    """shape.num_micro microbatches of random tokens (a fixed generator), every token counted."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(shape.num_micro):
        t = torch.randint(0, shape.vocab, (shape.micro_batch, shape.seq + 1), generator=gen).to(device)
        out.append({"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous(),
                    "loss_mask": torch.ones(shape.micro_batch, shape.seq, dtype=torch.float32, device=device)})
    return out


def step_flops(ours: Ours, shape):
    """Model FLOPs of one step (megatron/training/observability/flops.py: the figure our training log divides by)."""
    return num_floating_point_operations(ours.cfg, shape.micro_batch * shape.num_micro)


def disagreement(a, b, dtype):
    """None when first-step (loss, grad norm) pairs a and b agree, else what differs. Tolerances: fp32
    sums in another order (2e-5 of the loss, 1e-4 of the norm: hundreds of roundings of 6e-8);
    bf16 rounds activations to 8 bits (4e-3 each, averaging out in the mean loss: 1e-3), and the
    plain loop's grad norm is a bf16 sum of bf16 squares (2e-2)."""
    tol = (2e-5, 1e-4) if dtype == torch.float32 else (1e-3, 2e-2)
    for what, x, y, t in (("loss", a[0], b[0], tol[0]), ("grad norm", a[1], b[1], tol[1])):
        if not abs(x - y) <= t * abs(y):
            return f"first-step {what} {x} vs {y} (relative tolerance {t})"
    return None
