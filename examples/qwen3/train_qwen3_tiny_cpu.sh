#!/usr/bin/env bash
# A Qwen3-shaped dense model (megatron/core/models/families/qwen3.py), tiny, on the embedded corpus: rope,
# pre-norm RMSNorm, SwiGLU, grouped-query attention, per-head q/k norms (--qk-layernorm), no linear biases,
# kv-channels apart from hidden / heads, untied output. Extra flags are passed through ("$@").
#   bash examples/qwen3/train_qwen3_tiny_cpu.sh [--save ckpt/]      NPROC=2 for TP2 + SP
# tools/checkpoint/convert.py --loader megatron --saver hf turns its checkpoint into a Qwen3ForCausalLM.
# Qwen3-8B takes the same flags at its sizes:
#   --num-layers 36 --hidden-size 4096 --ffn-hidden-size 12288 --num-attention-heads 32 --num-query-groups 8
#   --kv-channels 128 --seq-length 4096 --max-position-embeddings 40960 --rotary-base 1000000
#   --norm-epsilon 1e-6 --bf16 (the 0.6B to 4B models tie the output: leave out --untie-embeddings-and-output-weights)
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
NPROC=${NPROC:-1}
LAUNCH=(python)
PARALLEL=()
if [ "$NPROC" -gt 1 ]; then
    LAUNCH=(torchrun --standalone --nproc-per-node "$NPROC")
    PARALLEL=(--tensor-model-parallel-size "$NPROC" --sequence-parallel)
fi
"${LAUNCH[@]}" pretrain_gpt.py \
    --num-layers 4 --hidden-size 128 --ffn-hidden-size 384 --num-attention-heads 8 \
    --group-query-attention --num-query-groups 2 --kv-channels 24 \
    --seq-length 256 --max-position-embeddings 256 --rotary-base 1000000 \
    --position-embedding-type rope --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --qk-layernorm \
    --disable-bias-linear --untie-embeddings-and-output-weights \
    --micro-batch-size 4 --global-batch-size 16 \
    --train-iters 200 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 20 \
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --seed 1234 \
    --hidden-dropout 0.0 --attention-dropout 0.0 \
    --log-interval 10 --eval-interval 100 --eval-iters 5 \
    --tensorboard-dir runs/qwen3_tiny "${PARALLEL[@]}" "$@"
