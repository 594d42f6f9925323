#!/usr/bin/env bash
# Megatron-LM's GPT-3 recipe (examples/gpt3/train_gpt3_175b_distributed.sh) scaled down: the same flags,
# with the sizes (layers, hidden, heads, sequence, batch, iterations, TP x PP) cut to a tiny model that
# runs on 4 CPU processes or GPUs. Left out: --step-batch-size-schedule (batch-size ramp-up; not
# implemented here). Without DATA_PATH it trains on synthetic tokens (--mock-data, NullTokenizer);
# with DATA_PATH (a preprocess_data.py prefix) and VOCAB_FILE / MERGE_FILE it reads GPT-2 BPE data.
#   bash examples/gpt/train_gpt3_small.sh [CHECKPOINT_DIR] [TENSORBOARD_DIR]
#   PRINT_ARGS=1 bash examples/gpt/train_gpt3_small.sh    # print the trainer's flags, one per line
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECKPOINT_PATH=${1:-checkpoints/gpt3_small}
TENSORBOARD_LOGS_PATH=${2:-runs/gpt3_small}
GPUS_PER_NODE=${GPUS_PER_NODE:-4}

GPT_MODEL_ARGS=(
    --num-layers 4
    --hidden-size 64
    --num-attention-heads 4
    --seq-length 64
    --max-position-embeddings 64
    --attention-backend auto
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 8
    --train-iters 50
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.006
    --clip-grad 1.0
    --fp16
    --lr 6.0e-5
    --lr-decay-style cosine
    --min-lr 6.0e-6
    --lr-warmup-fraction .001
    --lr-decay-iters 43
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
)
if [[ -n "${DATA_PATH:-}" ]]; then
    DATA_ARGS=(--data-path "$DATA_PATH" --tokenizer-type GPT2BPETokenizer --vocab-file "$VOCAB_FILE"
               --merge-file "$MERGE_FILE" --split 949,50,1)
else
    DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 50257 --split 949,50,1)
fi
EVAL_AND_LOGGING_ARGS=(
    --log-interval 10
    --save-interval 25
    --eval-interval 25
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --eval-iters 2
    --tensorboard-dir "$TENSORBOARD_LOGS_PATH"
)
ARGS=("${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}"
      "${EVAL_AND_LOGGING_ARGS[@]}")
if [[ -n "${PRINT_ARGS:-}" ]]; then
    printf '%s\n' "${ARGS[@]}"
    exit 0
fi
torchrun --standalone --nproc-per-node "$GPUS_PER_NODE" pretrain_gpt.py "${ARGS[@]}"
