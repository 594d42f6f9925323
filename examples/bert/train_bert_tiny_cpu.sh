#!/usr/bin/env bash
# A tiny BERT on CPU: 8 processes as TP 2 x PP 2 x DP 2, on the embedded standard-library text
# (WordPiece vocabulary and sentence-split dataset built and cached on the first run).
# Runs in about a minute on 2 cores. Extra flags are passed through ("$@").
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
torchrun --standalone --nproc-per-node 8 pretrain_bert.py \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    --num-layers 4 --hidden-size 128 --num-attention-heads 4 \
    --seq-length 128 --max-position-embeddings 128 \
    --micro-batch-size 4 --global-batch-size 32 \
    --train-iters 50 --lr 1e-3 --min-lr 1e-4 --lr-decay-style linear --lr-warmup-iters 5 \
    --weight-decay 0.01 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.999 --seed 1234 \
    --mask-prob 0.15 --short-seq-prob 0.1 \
    --log-interval 5 --eval-interval 25 --eval-iters 2 \
    --tensorboard-dir runs/bert_tiny_cpu "$@"
