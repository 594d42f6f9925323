"""GPT: embedding -> transformer block -> output layer -> vocab-parallel cross entropy."""
import re

import torch
from torch import nn

from ...pipeline_parallel.split import stage_layers
from ...tensor_parallel import mappings
from ...tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from ...tensor_parallel.layers import ColumnParallelLinear, VocabParallelEmbedding
from ...tensor_parallel.param_meta import set_init, set_init_key, set_tensor_parallel, set_tied_embedding
from ...transformer.block import TransformerBlock
from ...transformer.layer import hidden_dropout
from ...transformer.rope import rope_cos_sin


class GPTModel(nn.Module):
    """Decoder-only language model for one pipeline stage and one TP rank.

    forward(input_ids [b, s], labels [b, s] or None):
      labels given -> per-token loss [b, s] (fp32);
      else -> logits [b, s, V_padded/TP] of this TP rank's vocabulary slice.
    pre_process: this stage owns the embedding; post_process: the output layer and loss.
    Later stages take their input from set_input_tensor() (the pipeline executor calls it).
    Layers: num_layers from layer_offset, or by default this pipeline rank's share for
    model chunk vp_stage (pipeline_parallel/split.py; groups.pp_size and pp_rank).
    Talks to `groups.tp` (TP collectives).
    """

    def __init__(self, config, groups, pre_process=True, post_process=True,
                 num_layers=None, layer_offset=0, device=None, vp_stage=None):
        super().__init__()
        c = self.config = config
        self.groups = groups
        self.pre_process, self.post_process = pre_process, post_process
        self.share_embeddings = not c.untie_embeddings_and_output_weights
        self.input_tensor = None
        if num_layers is None:
            layer_offset, num_layers = stage_layers(c, groups.pp_size, groups.pp_rank, vp_stage)
        tp = groups.tp
        if pre_process or (post_process and self.share_embeddings):
            # with pipelining the last stage keeps its own copy of the tied table
            self.word_embeddings = VocabParallelEmbedding(
                c.padded_vocab_size, c.hidden_size, group=tp, unpadded_vocab_size=c.vocab_size,
                init_std=c.init_method_std, reduce_scatter_embeddings=c.sequence_parallel,
                params_dtype=c.params_dtype, device=device)
            if self.share_embeddings and pre_process != post_process:
                # the tied table lives on the first and the last stage: finalize_model_grads sums
                # its grads over groups.embd; the grad norm counts it once (param_meta.counted_once)
                set_tied_embedding(self.word_embeddings.weight)
        if pre_process and c.position_embedding_type == "learned_absolute":
            self.position_embeddings = nn.Parameter(torch.empty(
                c.max_position_embeddings, c.hidden_size, dtype=c.params_dtype, device=device))
            set_init(self.position_embeddings, "normal", c.init_method_std)
        self.decoder = TransformerBlock(c, tp, num_layers, layer_offset, post_process, device)
        if post_process and not self.share_embeddings:
            self.output_layer = ColumnParallelLinear(
                c.hidden_size, c.padded_vocab_size, group=tp, bias=False, init_std=c.init_method_std,
                sequence_parallel=c.sequence_parallel, params_dtype=c.params_dtype, device=device)
            set_tensor_parallel(self.output_layer.weight, 0, unpadded_size=c.vocab_size)
        self._assign_init_keys()

    def _assign_init_keys(self):
        """Layout-free parameter names: layers numbered over the whole model (for PP)."""
        offset = self.decoder.layer_offset
        for name, p in self.named_parameters():
            set_init_key(p, re.sub(r"decoder\.layers\.(\d+)\.",
                                   lambda m: f"decoder.layers.{int(m.group(1)) + offset}.", name))

    def embed(self, input_ids):
        """[b, s] ids -> [s(/TP with SP), b, h]."""
        c = self.config
        x = self.word_embeddings(input_ids.t())
        if c.position_embedding_type == "learned_absolute":
            pos = self.position_embeddings[: input_ids.shape[1]].unsqueeze(1)
            if c.sequence_parallel:
                pos = mappings.scatter_to_sequence_parallel_region(pos, self.groups.tp)
            x = x + pos
        return hidden_dropout(x, c.hidden_dropout, self.training, c.sequence_parallel)

    def output_weight(self):
        return self.word_embeddings.weight if self.share_embeddings else self.output_layer.weight

    def logits(self, hidden):
        """[s(/TP), b, h] -> [s, b, V_padded/TP] (this rank's vocabulary slice)."""
        if self.share_embeddings:
            if self.config.sequence_parallel:
                hidden = mappings.gather_from_sequence_parallel_region(hidden, self.groups.tp)
            else:
                hidden = mappings.copy_to_tensor_model_parallel_region(hidden, self.groups.tp)
            return torch.nn.functional.linear(hidden, self.word_embeddings.weight)
        return self.output_layer(hidden)[0]

    def set_input_tensor(self, tensor):
        """The previous stage's output [s(/TP), b, h], used by the next forward when not pre_process."""
        self.input_tensor = tensor

    def forward(self, input_ids, labels=None, hidden_states=None):
        """hidden_states: the previous stage's output when not pre_process (default: the
        tensor given to set_input_tensor). Returns hidden states [s(/TP), b, h] when not
        post_process."""
        c = self.config
        if self.pre_process:
            x = self.embed(input_ids)
        else:
            x = hidden_states if hidden_states is not None else self.input_tensor
        seq_len = input_ids.shape[1]
        rope = None
        if c.position_embedding_type == "rope":
            rope = rope_cos_sin(seq_len, c.kv_channels, c.rotary_base, x.device, x.dtype)
        x = self.decoder(x, rope)
        if not self.post_process:
            return x
        logits = self.logits(x)
        if labels is None:
            return logits.transpose(0, 1)
        return vocab_parallel_cross_entropy(logits, labels.t(), c.vocab_size, self.groups.tp).t()
