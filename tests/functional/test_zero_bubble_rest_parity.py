"""Zero-bubble schedules through the CLI, fp32, for parameters reached through other ops than a layer's
linear and norm (pipeline_parallel/backward_split.py: the position table, biases, BERT's heads): per-iteration losses
and grad norms of one process (test_parity.py's tiny model, 4 iterations, no evaluation).

GPT at PP2 zb-h2 with learned absolute positions read through --reset-position-ids (the table
indexed by position ids: each W sums the rows of duplicate positions) and biases on with the
bias-GeLU fusion asked for (on CPU the front adds the bias in torch; the fused kernel's
skip_bias_add path is unit-tested in tests/unit/test_weight_grad_rest.py). BERT at PP2 zb-h1: the token
types on the first stage, the LM head (its vocabulary bias and the tied table), pooler and binary head
on the last, all in W. The learned table's slice path runs in every GPT case of test_zero_bubble_parity.py."""
import pytest

from .cli import run_metrics
from .test_bert_parity import BASE as BERT_BASE
from .test_parity import assert_metrics_parity
from .test_zero_bubble_parity import FAST

PP2 = ["--pipeline-model-parallel-size", "2"]
SHORT = ["--train-iters", "4", "--eval-iters", "0"]  # the last flag wins
GPT = ["--position-embedding-type", "learned_absolute", "--reset-position-ids", "--num-layers", "4", "--lr", "1e-3"]


@pytest.mark.slow
def test_gpt_learned_positions_by_position_ids_and_biases_zb_h2_pp2_match_one_process():
    assert "--disable-bias-linear" not in FAST and "--no-bias-gelu-fusion" not in FAST
    ref = run_metrics(FAST + GPT)[1]
    assert_metrics_parity(ref, run_metrics(FAST + GPT + PP2 + ["--pipeline-schedule", "zb-h2"], nproc=2)[1])


@pytest.mark.slow
def test_bert_heads_and_token_types_zb_h1_pp2_match_one_process():
    terms = ["lm loss", "sop loss"]
    ref = run_metrics(BERT_BASE + SHORT, script="pretrain_bert.py")[1]
    got = run_metrics(BERT_BASE + SHORT + PP2 + ["--pipeline-schedule", "zb-h1"], nproc=2,
                      script="pretrain_bert.py")[1]
    assert sorted(ref["train"]) == [1, 2, 3, 4] and sorted(ref["train"][1]["losses"]) == terms
    assert_metrics_parity(ref, got, terms)
