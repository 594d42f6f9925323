#!/usr/bin/env bash
# Seed 004's Mixture-of-Experts model as a recipe: 8 experts, top-2, hidden 384, 6 layers, 8 heads,
# sequence 1024, every layer MoE (GeLU experts of 4 x hidden = 1536), on the embedded corpus (Python's
# standard library, SentencePiece vocabulary of 1024: about 60M parameters, 79M with GPT-2's 50257
# vocabulary as seed 004; about 17M of them active per token).
# Runs on one process by default; EP=2 NPROC=2 (or 4, 8, ...) splits the experts over expert-parallel
# ranks carved out of the data-parallel ones. Extra flags are passed through ("$@"; the last of a flag wins).
# OPTIMIZER=muon: the experiment's own Muon + AdamW hybrid (docs/muon.md): Muon on the 2-D hidden matrices
# (attention, each expert's fc1 / fc2, the router) and AdamW on the embeddings, output layer, norms and biases.
#   bash examples/moe/train_moe_seed004.sh
#   EP=2 NPROC=4 bash examples/moe/train_moe_seed004.sh --moe-token-dispatcher-type alltoall
#   OPTIMIZER=muon bash examples/moe/train_moe_seed004.sh
#   PRINT_ARGS=1 bash examples/moe/train_moe_seed004.sh    # print the trainer's flags, one per line
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
NPROC=${NPROC:-1}
EP=${EP:-1}
LAUNCH=(python)
if [ "$NPROC" -gt 1 ]; then LAUNCH=(torchrun --standalone --nproc-per-node "$NPROC"); fi
ARGS=(
    --num-layers 6 --hidden-size 384 --num-attention-heads 8 --ffn-hidden-size 1536
    --seq-length 1024 --max-position-embeddings 1024
    --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
    --moe-z-loss-coeff 1e-3 --moe-token-dispatcher-type alltoall --moe-grouped-gemm
    --expert-model-parallel-size "$EP" --disable-bias-linear
    --micro-batch-size 4 --global-batch-size 16
    --train-iters 200 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 20
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --seed 1234
    --hidden-dropout 0.0 --attention-dropout 0.0
    --log-interval 10 --eval-interval 100 --eval-iters 5
    --tensorboard-dir runs/moe_seed004
)
case "${OPTIMIZER:-adam}" in
    adam) ;;
    # Megatron-LM's Muon defaults (momentum 0.9, quintic Newton-Schulz x 5, spectral scale); the same LR
    # schedule as AdamW's, which takes the rest of the parameters
    muon) ARGS+=(--optimizer muon --tensorboard-dir runs/moe_seed004_muon) ;;
    *) echo "error: OPTIMIZER=${OPTIMIZER}: adam or muon" >&2; exit 2 ;;
esac
ARGS+=("$@")
if [[ -n "${PRINT_ARGS:-}" ]]; then
    printf '%s\n' "${ARGS[@]}"
    exit 0
fi
"${LAUNCH[@]}" pretrain_gpt.py "${ARGS[@]}"
