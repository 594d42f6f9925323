"""GPT: embedding -> transformer block -> output layer -> vocab-parallel cross entropy."""
from ...transformer.mtp import MTPBlock
from ..common.language_module import LanguageModule


class GPTModel(LanguageModule):
    """Decoder-only language model for one pipeline stage and one TP rank.

    forward(input_ids [b, s], labels [b, s] or None):
      labels given -> per-token loss [b, s] (fp32);
      else -> logits [b, s, V_padded/TP] of this TP rank's vocabulary slice.
    pre_process: this stage owns the embedding; post_process: the output layer and loss.
    Later stages take their input from set_input_tensor() (the pipeline executor calls it).
    Layers: num_layers from layer_offset, or by default this pipeline rank's share for
    model chunk vp_stage (pipeline_parallel/split.py; groups.pp_size and pp_rank).
    Talks to `groups.tp` (TP collectives). With --mtp-num-layers the last stage holds the multi-token
    prediction modules (`mtp`, transformer/mtp.py).
    """

    def __init__(self, config, groups, pre_process=True, post_process=True,
                 num_layers=None, layer_offset=0, device=None, vp_stage=None):
        super().__init__(config, groups, pre_process, post_process, num_layers, layer_offset, device, vp_stage)
        self.mtp = MTPBlock(config, groups, device) if post_process and config.mtp_num_layers else None
        self._assign_init_keys()

    def embed(self, input_ids, position_offset=0, position_ids=None):
        """[b, s] ids at positions position_offset.. (or position_ids [b, s]) -> [s(/TP with SP), b, h]."""
        return self.embedding_dropout(self.embedding_sum(input_ids, position_offset=position_offset,
                                                         position_ids=position_ids))

    def forward(self, input_ids, labels=None, hidden_states=None, kv_cache=None, position_ids=None,
                attention_mask=None, mtp_inputs=None):
        """hidden_states: the previous stage's output when not pre_process (default: the
        tensor given to set_input_tensor). Returns hidden states [s(/TP), b, h] when not
        post_process. kv_cache: a KVCache (transformer/kv_cache.py) for incremental decoding:
        input_ids are the tokens after the cached ones, and their keys / values join it.
        position_ids [b, s] and attention_mask (a transformer/documents.Documents of packed documents, or
        a [b, 1, s, s] bool mask, True = may attend) replace the positions 0.. and the causal mask
        (--reset-position-ids, --reset-attention-mask).
        mtp_inputs: [(tokens_k, labels_k)] (transformer/mtp.py mtp_inputs) with labels: on the last stage
        returns (per-token loss, [per-token MTP loss of depth k]); None (generation, evaluation of
        logits): the MTP modules do not run."""
        position_offset = kv_cache.seq_len if kv_cache is not None else 0
        x = self.embed(input_ids, position_offset, position_ids) if self.pre_process \
            else self.stage_input(hidden_states)
        rope = self.rotary(input_ids.shape[1], position_offset, x, position_ids)
        x = self.decoder(x, rope, attention_mask, kv_cache=kv_cache)
        if not self.post_process:
            return x
        logits = self.logits(x)
        if labels is None:
            return logits.transpose(0, 1)
        loss = self.loss(logits, labels)
        if mtp_inputs is None or self.mtp is None:
            return loss
        return loss, self.mtp(x, mtp_inputs, lambda tokens: self.embed(tokens, position_ids=position_ids),
                              lambda h, labels_k: self.loss(self.logits(h), labels_k), rope, attention_mask)
