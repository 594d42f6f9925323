#!/usr/bin/env bash
# Multi-node expert parallelism: run this on every node (same MASTER_ADDR, NODE_RANK 0..NNODES-1).
# Layout: TP inside a node, EP over the data-parallel ranks (EP x expert-DP = DP), PP across nodes.
# With 2 nodes of 8 GPUs and TP=2, PP=2: DP=4, EP=4 puts 2 of the 8 experts on each EP rank.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 bash examples/moe/train_moe_multinode.sh --data-path ... \
#       --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-2}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" pretrain_gpt.py \
    --tensor-model-parallel-size ${TP:-2} --pipeline-model-parallel-size ${PP:-2} --sequence-parallel \
    --expert-model-parallel-size ${EP:-4} --moe-token-dispatcher-type alltoall --moe-grouped-gemm \
    --num-layers 12 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \
    --max-position-embeddings 2048 --position-embedding-type rope --normalization RMSNorm --swiglu \
    --disable-bias-linear --untie-embeddings-and-output-weights \
    --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 2816 --moe-aux-loss-coeff 1e-2 \
    --moe-router-load-balancing-type aux_loss --moe-z-loss-coeff 1e-3 \
    --micro-batch-size 1 --global-batch-size 256 --bf16 --use-distributed-optimizer \
    --train-iters 10000 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 500 \
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 \
    --log-interval 10 --eval-interval 1000 --eval-iters 10 \
    --save checkpoints/moe_multinode --save-interval 1000 "$@"
