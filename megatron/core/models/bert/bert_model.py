"""BERT: embeddings (word + position + token type) -> bidirectional encoder -> LM head and
binary (next-sentence / sentence-order) head on the pooled first token."""
import torch
import torch.nn.functional as F
from torch import nn

from ...tensor_parallel import mappings, wgrad_fusion
from ...tensor_parallel.param_meta import set_init, set_not_muon, set_sequence_parallel, set_tensor_parallel
from ...transformer.norm import build_norm
from ..common.language_module import LanguageModule

NUM_TOKENTYPES = 2


class ReplicatedLinear(nn.Module):
    """y = x W^T + b with W [out, in] whole on every TP rank.

    sequence_parallel: its input is a sequence shard, so its gradients are partial sums
    that finalize_model_grads adds over the TP group (as the norms' are)."""

    def __init__(self, in_features, out_features, init_std, sequence_parallel=False,
                 params_dtype=torch.float32, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=params_dtype, device=device))
        set_init(self.weight, "normal", init_std)
        set_init(self.bias, "zeros")
        set_sequence_parallel(self.weight, sequence_parallel)
        set_sequence_parallel(self.bias, sequence_parallel)

    def forward(self, x):
        return wgrad_fusion.linear_or_fused(x, self.weight, self.bias)


class BertLMHead(nn.Module):
    """[s(/TP), b, h] -> [s, b, V_padded/TP] logits: dense, GeLU, norm, then the word
    embedding table (tied) plus a vocabulary-parallel bias. Talks to the TP group."""

    def __init__(self, config, tp_group, device=None):
        super().__init__()
        self.config, self.tp_group = config, tp_group
        self.dense = ReplicatedLinear(config.hidden_size, config.hidden_size, config.init_method_std,
                                      config.sequence_parallel, config.params_dtype, device)
        self.layernorm = build_norm(config, device)
        per_rank = config.padded_vocab_size // config.tensor_model_parallel_size
        self.bias = nn.Parameter(torch.empty(per_rank, dtype=config.params_dtype, device=device))
        set_init(self.bias, "zeros")
        set_tensor_parallel(self.bias, 0, unpadded_size=config.vocab_size)

    def forward(self, hidden, word_embeddings):
        x = self.layernorm(F.gelu(self.dense(hidden), approximate="tanh" if self.config.openai_gelu else "none"))
        if self.config.sequence_parallel:
            x = mappings.gather_from_sequence_parallel_region(x, self.tp_group)
        else:
            x = mappings.copy_to_tensor_model_parallel_region(x, self.tp_group)
        return F.linear(x, word_embeddings, self.bias)


class BertModel(LanguageModule):
    """Bidirectional encoder for one pipeline stage and one TP rank.

    forward(input_ids [b, s], padding_mask [b, s] (True = real token), tokentype_ids [b, s],
            lm_labels [b, s] or None, binary_labels [b] or None):
      lm_labels given -> (per-token LM loss [b, s] fp32, per-sample binary loss [b] fp32 or None);
      else -> (LM logits [b, s, V_padded/TP], binary logits [b, 2] or None).
    Not post_process: hidden states [s(/TP), b, h] for the next stage. Pre-norm layers and a
    final norm by default; --post-norm gives BERT's original post-norm layers and a norm on
    the embeddings. The pooler and binary head (absent with add_binary_head=False) are
    replicated over TP. Talks to `groups.tp`; the tied table's grads go over `groups.embd`.
    """

    def __init__(self, config, groups, pre_process=True, post_process=True, add_binary_head=True,
                 device=None, vp_stage=None):
        if config.untie_embeddings_and_output_weights:
            raise ValueError("BERT's LM head is tied to the word embedding: drop --untie-embeddings-and-output-weights")
        super().__init__(config, groups, pre_process=pre_process, post_process=post_process, device=device,
                         vp_stage=vp_stage)
        self.add_binary_head = add_binary_head
        if pre_process:
            self.tokentype_embeddings = nn.Parameter(torch.empty(
                NUM_TOKENTYPES, config.hidden_size, dtype=config.params_dtype, device=device))
            set_init(self.tokentype_embeddings, "normal", config.init_method_std)
            set_not_muon(self.tokentype_embeddings)
            if config.post_norm:
                self.embedding_layernorm = build_norm(config, device)
        if post_process:
            self.lm_head = BertLMHead(config, groups.tp, device)
            if add_binary_head:
                self.pooler = ReplicatedLinear(config.hidden_size, config.hidden_size, config.init_method_std,
                                               params_dtype=config.params_dtype, device=device)
                self.binary_head = ReplicatedLinear(config.hidden_size, 2, config.init_method_std,
                                                    params_dtype=config.params_dtype, device=device)
        self._assign_init_keys()

    def embed(self, input_ids, tokentype_ids=None):
        """[b, s] ids and token types -> [s(/TP with SP), b, h]."""
        tokentypes = None
        if tokentype_ids is not None:
            tokentypes = F.embedding(tokentype_ids.t(), self.tokentype_embeddings)
        x = self.embedding_sum(input_ids, tokentypes)
        if self.config.post_norm:
            x = self.embedding_layernorm(x)
        return self.embedding_dropout(x)

    def logits(self, hidden):
        """[s(/TP), b, h] -> [s, b, V_padded/TP]: the LM head over the tied word table."""
        return self.lm_head(hidden, self.word_embeddings.weight)

    def pooled(self, hidden):
        """[s(/TP), b, h] -> tanh(dense(first token)) [b, h], the same on every TP rank."""
        if self.config.sequence_parallel:
            # replicated consumer: its gradient is whole on every rank, so backward keeps a slice
            hidden = mappings.gather_from_sequence_parallel_region(hidden, self.groups.tp,
                                                                   tensor_parallel_output_grad=False)
        return torch.tanh(self.pooler(hidden[0]))

    def forward(self, input_ids, padding_mask, tokentype_ids=None, lm_labels=None, binary_labels=None,
                hidden_states=None):
        x = self.embed(input_ids, tokentype_ids) if self.pre_process else self.stage_input(hidden_states)
        attn_mask = padding_mask.bool()[:, None, None, :]  # [b, 1, 1, s]: every query sees all real keys
        x = self.decoder(x, None, attn_mask)
        if not self.post_process:
            return x
        logits = self.logits(x)
        binary = self.binary_head(self.pooled(x)) if self.add_binary_head else None
        if lm_labels is None:
            return logits.transpose(0, 1), binary
        lm_loss = self.loss(logits, lm_labels)
        binary_loss = None
        if binary is not None and binary_labels is not None:
            binary_loss = F.cross_entropy(binary.float(), binary_labels, reduction="none")
        return lm_loss, binary_loss
