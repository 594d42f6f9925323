"""LanguageModule: the parts GPT and BERT share, for one pipeline stage and one TP rank.

First stage (pre_process): the vocabulary-parallel word embedding and, with learned-absolute
positions, the position table. Every stage: its layers of the transformer block (`decoder`).
Last stage (post_process): the output layer (the word table itself when tied) and the
vocabulary-parallel cross entropy. Later stages take their input from set_input_tensor().
The module paths (word_embeddings, position_embeddings, decoder.layers.N, output_layer) are
the checkpoint and Hugging Face conversion names: keep them.
"""
import re

import torch
from torch import nn

from ...fp8.config import output_layer_fp8
from ...fp8.linear import fp8_linear
from ...fp8.recipes import build_recipe
from ...pipeline_parallel.split import stage_layers
from ...tensor_parallel import mappings, wgrad_fusion
from ...tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from ...tensor_parallel.cross_entropy_fused import fused_vocab_parallel_cross_entropy
from ...tensor_parallel.layers import ColumnParallelLinear, VocabParallelEmbedding
from ...tensor_parallel.param_meta import (
    set_embedding_or_output,
    set_init,
    set_init_key,
    set_not_muon,
    set_tensor_parallel,
    set_tied_embedding,
)
from ...transformer.block import TransformerBlock
from ...transformer.layer import hidden_dropout
from ...transformer.mla_rope import mla_cos_sin
from ...transformer.rope import rope_cos_sin


class LanguageModule(nn.Module):
    """Embedding -> transformer block -> output layer and loss, split over pipeline stages.

    Layers: num_layers from layer_offset, or by default this pipeline rank's share for model
    chunk vp_stage (pipeline_parallel/split.py; groups.pp_size and pp_rank). Subclasses add
    their own modules, then call _assign_init_keys() once, last. Talks to `groups.tp`; the tied
    table's grads go over `groups.embd` (finalize_model_grads).
    """

    def __init__(self, config, groups, pre_process=True, post_process=True,
                 num_layers=None, layer_offset=0, device=None, vp_stage=None):
        super().__init__()
        self.config = config
        self.groups = groups
        self.pre_process, self.post_process = pre_process, post_process
        self.share_embeddings = not config.untie_embeddings_and_output_weights
        self.input_tensor = None
        if num_layers is None:
            layer_offset, num_layers = stage_layers(config, groups.layout, groups.pp_rank, vp_stage)
        tp = groups.tp
        # the last stage reads the word table too where the output layer is tied to it or multi-token
        # prediction embeds the next tokens with it
        shared = self.share_embeddings or bool(config.mtp_num_layers)
        if pre_process or (post_process and shared):
            # with pipelining the last stage keeps its own copy of the table
            self.word_embeddings = VocabParallelEmbedding(
                config.padded_vocab_size, config.hidden_size, group=tp, unpadded_vocab_size=config.vocab_size,
                init_std=config.init_method_std, reduce_scatter_embeddings=config.sequence_parallel,
                params_dtype=config.params_dtype, device=device)
            set_embedding_or_output(self.word_embeddings.weight)
            if shared and pre_process != post_process:
                # the tied table lives on the first and the last stage: finalize_model_grads sums
                # its grads over groups.embd; the grad norm counts it once (param_meta.counted_once)
                set_tied_embedding(self.word_embeddings.weight, output_copy=post_process)
        if pre_process and config.position_embedding_type == "learned_absolute":
            self.position_embeddings = nn.Parameter(torch.empty(
                config.max_position_embeddings, config.hidden_size, dtype=config.params_dtype, device=device))
            set_init(self.position_embeddings, "normal", config.init_method_std)
            set_not_muon(self.position_embeddings)  # an embedding table, not a hidden matrix
        self.decoder = TransformerBlock(config, groups, num_layers, layer_offset, post_process, device)
        fp8 = output_layer_fp8(config) if post_process else None
        # --fp8-output-layer with the tied table: the recipe of its GEMM as the output layer (amaxes as a
        # column-parallel linear's: over TP and CP); model_state.py saves it under output_layer.fp8.
        self.output_fp8 = build_recipe(fp8, (tp, groups.cp), (tp,)) if fp8 and self.share_embeddings else None
        if post_process and not self.share_embeddings:
            self.output_layer = ColumnParallelLinear(
                config.hidden_size, config.padded_vocab_size, group=tp, bias=False,
                init_std=config.init_method_std, sequence_parallel=config.sequence_parallel,
                params_dtype=config.params_dtype, device=device, fp8=fp8, cp_group=groups.cp)
            set_tensor_parallel(self.output_layer.weight, 0, unpadded_size=config.vocab_size)
            set_embedding_or_output(self.output_layer.weight)

    def _assign_init_keys(self):
        """Layout-free parameter names: layers numbered over the whole model (for PP)."""
        offset = self.decoder.layer_offset
        for name, p in self.named_parameters():
            set_init_key(p, re.sub(r"decoder\.layers\.(\d+)\.",
                                   lambda m: f"decoder.layers.{int(m.group(1)) + offset}.", name))

    def set_input_tensor(self, tensor):
        """The previous stage's output [s(/TP), b, h], used by the next forward when not pre_process."""
        self.input_tensor = tensor

    def stage_input(self, hidden_states=None):
        """This stage's input when not pre_process: hidden_states, else the set_input_tensor() one."""
        return hidden_states if hidden_states is not None else self.input_tensor

    def embedding_sum(self, input_ids, extra=None, position_offset=0, position_ids=None):
        """[b, s] ids at positions position_offset.. (or position_ids [b, s]) -> word + learned position
        (+ extra [s, b, h], e.g. BERT's token types) embeddings [s(/TP with SP), b, h], before dropout."""
        config = self.config
        x = self.word_embeddings(input_ids.t())
        added = extra
        if config.position_embedding_type == "learned_absolute":
            added = self.position_embeddings[position_offset: position_offset + input_ids.shape[1]].unsqueeze(1) \
                if position_ids is None else self.position_embeddings[position_ids.t()]
            if extra is not None:
                added = added + extra
        if added is None:
            return x
        if config.sequence_parallel:
            added = mappings.scatter_to_sequence_parallel_region(added, self.groups.tp)
        return x + added

    def embedding_dropout(self, x):
        return hidden_dropout(x, self.config.hidden_dropout, self.training, self.config.sequence_parallel)

    def rotary(self, seq_len, position_offset, like, position_ids=None):
        """(cos, sin) [s, 1, 1, d] for positions position_offset.. ([s, b, 1, d] for position_ids
        [b, s]), or None without rope."""
        config = self.config
        if config.position_embedding_type != "rope":
            return None
        if position_ids is not None:  # context parallelism gives global positions past the local seq_len
            cos, sin = self._rope_table(max(seq_len, config.seq_length), like)
            return cos[:, 0][position_ids.t()], sin[:, 0][position_ids.t()]
        cos, sin = self._rope_table(position_offset + seq_len, like)
        return cos[position_offset:], sin[position_offset:]

    def _rope_table(self, length, like):
        """cos, sin [length, 1, 1, d] of positions 0.. (multi-latent attention's own: mla_rope.py)."""
        config = self.config
        if config.multi_latent_attention:
            return mla_cos_sin(config, length, like.device, like.dtype)
        return rope_cos_sin(length, config.rotary_dim, config.rotary_base, like.device, like.dtype)

    def output_weight(self):
        return self.word_embeddings.weight if self.share_embeddings else self.output_layer.weight

    def logits(self, hidden):
        """[s(/TP), b, h] -> [s, b, V_padded/TP] (this rank's vocabulary slice)."""
        if self.share_embeddings:
            if self.config.sequence_parallel:
                hidden = mappings.gather_from_sequence_parallel_region(hidden, self.groups.tp)
            else:
                hidden = mappings.copy_to_tensor_model_parallel_region(hidden, self.groups.tp)
            if self.output_fp8 is not None:
                # where the embedding uses the table too, a view: its FP8 weight gradient then reaches the
                # table through autograd with the embedding's (DDP counts one gradient per micro-batch)
                weight = self.word_embeddings.weight
                return fp8_linear(hidden, weight.view_as(weight) if self.pre_process else weight, None,
                                  self.output_fp8)
            if not self.pre_process:  # the table's one use here: its gradient may go straight to DDP's buffer
                return wgrad_fusion.linear_or_fused(hidden, self.word_embeddings.weight)
            return torch.nn.functional.linear(hidden, self.word_embeddings.weight)
        return self.output_layer(hidden)[0]

    def loss(self, logits, labels):
        """logits [s, b, V_padded/TP], labels [b, s] -> per-token cross entropy [b, s] (fp32)."""
        fused = self.config.cross_entropy_loss_fusion
        ce = fused_vocab_parallel_cross_entropy if fused else vocab_parallel_cross_entropy
        return ce(logits, labels.t(), self.config.vocab_size, self.groups.tp).t()
