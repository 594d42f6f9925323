#!/usr/bin/env bash
# Megatron-LM's Llama 3 8B recipe (examples/llama/train_llama3_8b_h100_fp8.sh) scaled down: its model and
# schedule flags with the sizes (layers, hidden, heads, sequence, batch, samples) cut to a tiny model on
# 2 CPU processes or GPUs, sample-based as there. Left out, not implemented here: fp8 (--fp8-*), the
# decoupled embedding LR (--decoupled-lr, --decoupled-min-lr), --apply-layernorm-1p, context
# parallelism (--context-parallel-size), --cross-entropy-loss-fusion, --calculate-per-token-loss,
# --manual-gc, --empty-unused-memory-level, the profiler and data-loader flags (--profile*,
# --log-throughput, --num-workers, --no-mmap-bin-files, --no-create-attention-mask-in-dataloader,
# --tiktoken-pattern); --attention-backend fused (Transformer Engine) is auto here, so that it runs anywhere.
# Without TOKENIZER_MODEL / DATA_PATH: synthetic tokens; with them, a Llama 2 SentencePiece model
# (Llama2Tokenizer, read from the local file) and a preprocess_data.py prefix.
#   bash examples/llama/train_llama_small.sh [CHECKPOINT_DIR] [TENSORBOARD_DIR]
#   PRINT_ARGS=1 bash examples/llama/train_llama_small.sh    # print the trainer's flags, one per line
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECKPOINT_PATH=${1:-checkpoints/llama_small}
TENSORBOARD_LOGS_PATH=${2:-runs/llama_small}
GPUS_PER_NODE=${GPUS_PER_NODE:-2}
TP_SIZE=2
MICRO_BATCH_SIZE=1
GLOBAL_BATCH_SIZE=8
NUM_LAYERS=2
SEQ_LENGTH=64
MAX_POSITION_EMBEDDINGS=64

MODEL_ARGS=(
    --use-mcore-models
    --num-layers $NUM_LAYERS
    --hidden-size 64
    --ffn-hidden-size 224
    --num-attention-heads 8
    --group-query-attention
    --num-query-groups 2
    --kv-channels 8
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $MAX_POSITION_EMBEDDINGS
    --position-embedding-type rope
    --rotary-base 1000000
    --rotary-percent 1.0
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --swiglu
    --normalization RMSNorm
    --init-method-std 0.0134
    --attention-backend auto
    --untie-embeddings-and-output-weights
    --disable-bias-linear
)
TRAINING_ARGS=(
    --micro-batch-size $MICRO_BATCH_SIZE
    --global-batch-size $GLOBAL_BATCH_SIZE
    --train-samples 400
    --lr-decay-samples 396
    --lr-warmup-samples 16
    --lr 0.00015
    --min-lr 0.00001
    --lr-decay-style cosine
    --clip-grad 1.0
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --bf16
    --grad-reduce-in-bf16
    --exit-duration-in-mins 235
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    --sequence-parallel
)
if [[ -n "${TOKENIZER_MODEL:-}" && -n "${DATA_PATH:-}" ]]; then
    DATA_ARGS=(--data-path "$DATA_PATH" --tokenizer-type Llama2Tokenizer --tokenizer-model "$TOKENIZER_MODEL"
               --split 99,1,0)
else
    DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128256 --split 99,1,0)
fi
EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --eval-iters 2
    --eval-interval 25
    --save-interval 25
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --tensorboard-dir "$TENSORBOARD_LOGS_PATH"
)
ARGS=("${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}"
      "${EVAL_AND_LOGGING_ARGS[@]}")
if [[ -n "${PRINT_ARGS:-}" ]]; then
    printf '%s\n' "${ARGS[@]}"
    exit 0
fi
torchrun --standalone --nproc-per-node "$GPUS_PER_NODE" pretrain_gpt.py "${ARGS[@]}"
