"""pretrain_bert.py's own options (generated into its CLI like the other config dataclasses)."""
from dataclasses import dataclass

from ...core.config import ConfigError, opt


@dataclass
class BertOptions:
    """pretrain_bert.py's own flags (Megatron-LM names where it has them)."""
    bert_binary_head: bool = opt(True, "Train the masked LM alone, without the binary head on the first token "
                                 "(samples are then single segments).", flag="--bert-no-binary-head")
    binary_head_task: str = opt("sop", "What the binary head predicts: sop (sentence order: were the two segments "
                                "swapped?, ALBERT / Megatron-LM) or nsp (next sentence: is the second segment from "
                                "another document?, original BERT).", choices=["sop", "nsp"])
    mask_prob: float = opt(0.15, "Fraction of each sample's tokens chosen for the masked-LM loss (80%% replaced "
                           "by [MASK], 10%% by a random token, 10%% kept).")
    short_seq_prob: float = opt(0.1, "Probability that a sample is built to a random length shorter than "
                                "--seq-length (so the model also sees short inputs).")

    def validate(self):
        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"--mask-prob must be in (0, 1), got {self.mask_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"--short-seq-prob must be in [0, 1], got {self.short_seq_prob}")

    @property
    def loss_terms(self):
        """{logged loss name: batch key of its mask (None: one per sample)}."""
        terms = {"lm loss": "loss_mask"}
        if self.bert_binary_head:
            terms[f"{self.binary_head_task} loss"] = None
        return terms
