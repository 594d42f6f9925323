#!/usr/bin/env bash
# A tiny GPT on CPU: 4 processes as TP 2 x DP 2 with sequence parallelism, on synthetic tokens.
# Runs in about a minute on 2 cores. Extra flags are passed through ("$@").
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
torchrun --standalone --nproc-per-node 4 pretrain_gpt.py \
    --tensor-model-parallel-size 2 --sequence-parallel \
    --num-layers 4 --hidden-size 128 --num-attention-heads 4 \
    --seq-length 128 --max-position-embeddings 128 \
    --micro-batch-size 4 --global-batch-size 16 \
    --train-iters 50 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 5 \
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --seed 1234 \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 1024 \
    --log-interval 5 --eval-interval 25 --eval-iters 2 \
    --tensorboard-dir runs/gpt_tiny_cpu "$@"
