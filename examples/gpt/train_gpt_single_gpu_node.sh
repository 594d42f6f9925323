#!/usr/bin/env bash
# A ~350M-parameter GPT on one node of GPUs: TP over the node's GPUs (set GPUS, default 8),
# synthetic tokens. NCCL is picked automatically when CUDA is present.
# Multi-node: replace --standalone with --nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:29500.
set -euo pipefail
cd "$(dirname "$0")/../.."
GPUS=${GPUS:-8}
TP=${TP:-2}
torchrun --standalone --nproc-per-node "$GPUS" pretrain_gpt.py \
    --tensor-model-parallel-size "$TP" --sequence-parallel \
    --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
    --seq-length 2048 --max-position-embeddings 2048 \
    --micro-batch-size 4 --global-batch-size $((4 * GPUS / TP * 8)) \
    --train-iters 1000 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 100 \
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --seed 1234 \
    --hidden-dropout 0.0 --attention-dropout 0.0 \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 50257 \
    --log-interval 10 --eval-interval 200 --eval-iters 10 --log-throughput \
    --tensorboard-dir runs/gpt_350m "$@"
