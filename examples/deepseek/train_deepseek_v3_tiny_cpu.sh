#!/usr/bin/env bash
# A DeepSeek-V3-shaped model scaled down to train on a CPU (docs/deepseek.md): multi-latent attention with
# query compression, latent RMSNorms and YaRN RoPE; the first layer dense, the rest MoE with 16 fine-grained
# experts in 4 groups (each token's 4 experts from 2 groups), one shared expert, sigmoid routing scaled by 2.5,
# the auxiliary-loss-free expert bias and a small sequence balance loss; one multi-token prediction module.
# On the embedded corpus (Python's standard library) unless data flags are given; extra flags pass through.
#   bash examples/deepseek/train_deepseek_v3_tiny_cpu.sh
#   NPROC=4 bash examples/deepseek/train_deepseek_v3_tiny_cpu.sh --tensor-model-parallel-size 2 \
#       --sequence-parallel --expert-model-parallel-size 2
#
# The full-size model (671B, 37B active) takes the same flags at DeepSeek-V3's sizes:
#   --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 --seq-length 4096
#   --max-position-embeddings 4096 --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128
#   --qk-pos-emb-head-dim 64 --v-head-dim 128 --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0
#   --yarn-original-max-position-embeddings 4096 --num-experts 256 --moe-ffn-hidden-size 2048
#   --moe-shared-expert-intermediate-size 2048 --moe-layer-freq '([0]*3+[1]*58)' --moe-router-topk 8
#   --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5
#   --norm-epsilon 1e-6 --make-vocab-size-divisible-by 3232 --mtp-num-layers 1 --bf16
# tools/plan.py's first choice for it on 256 H100-SXM (global batch 2048; docs/deepseek.md has the command
# and its top three; the cost model counts MLA's GEMMs, activations and collectives and the MTP module):
#   --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
#   --expert-model-parallel-size 16 --moe-token-dispatcher-type alltoall --micro-batch-size 1
#   --use-distributed-optimizer --data-parallel-sharding-strategy optim_grads_params --overlap-grad-reduce
#   --overlap-param-gather --recompute-granularity full   (predicted 46.0 s/iteration, 274 TFLOP/s per GPU, 69.7 GB)
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
NPROC=${NPROC:-1}
LAUNCH=(python)
if [ "$NPROC" -gt 1 ]; then LAUNCH=(torchrun --standalone --nproc-per-node "$NPROC"); fi
"${LAUNCH[@]}" pretrain_gpt.py \
    --num-layers 4 --hidden-size 128 --ffn-hidden-size 352 --num-attention-heads 4 \
    --seq-length 256 --max-position-embeddings 256 \
    --position-embedding-type rope --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --multi-latent-attention --q-lora-rank 48 --kv-lora-rank 32 --qk-head-dim 32 --qk-pos-emb-head-dim 16 \
    --v-head-dim 32 --qk-layernorm --rope-type yarn --rotary-scaling-factor 4 --mscale 1.0 --mscale-all-dim 1.0 \
    --yarn-original-max-position-embeddings 64 \
    --num-experts 16 --moe-ffn-hidden-size 64 --moe-shared-expert-intermediate-size 64 --moe-layer-freq '([0]+[1]*3)' \
    --moe-router-topk 4 --moe-router-num-groups 4 --moe-router-group-topk 2 --moe-router-topk-scaling-factor 2.5 \
    --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-3 \
    --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4 --moe-router-dtype fp32 \
    --moe-token-dispatcher-type alltoall --moe-grouped-gemm \
    --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 \
    --micro-batch-size 4 --global-batch-size 16 \
    --train-iters 200 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 20 \
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --seed 1234 \
    --hidden-dropout 0.0 --attention-dropout 0.0 \
    --log-interval 10 --eval-interval 100 --eval-iters 5 \
    --tensorboard-dir runs/deepseek_v3_tiny "$@"
