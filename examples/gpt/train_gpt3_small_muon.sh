#!/usr/bin/env bash
# examples/gpt/train_gpt3_small.sh with Muon: the same flags (4 CPU processes or GPUs, TP2 x PP2, fp16), and
# --optimizer muon: Muon on the 2-D hidden matrices, AdamW (its --adam-* flags) on the embeddings, norms and
# biases, one LR schedule for both (docs/muon.md). Muon's update has an RMS of about 1 (spectral scale)
# where AdamW's is about 0.2: --muon-extra-scale-factor 0.2 keeps the recipe's learning rate meaningful.
#   bash examples/gpt/train_gpt3_small_muon.sh [CHECKPOINT_DIR] [TENSORBOARD_DIR]
#   PRINT_ARGS=1 bash examples/gpt/train_gpt3_small_muon.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
mapfile -t ARGS < <(PRINT_ARGS=1 bash examples/gpt/train_gpt3_small.sh "${1:-checkpoints/gpt3_small_muon}" \
                    "${2:-runs/gpt3_small_muon}")
ARGS+=(--optimizer muon --muon-momentum 0.9 --muon-num-ns-steps 5 --muon-scale-mode spectral
       --muon-extra-scale-factor 0.2 --muon-tp-mode duplicated)
if [[ -n "${PRINT_ARGS:-}" ]]; then
    printf '%s\n' "${ARGS[@]}"
    exit 0
fi
torchrun --standalone --nproc-per-node "$GPUS_PER_NODE" pretrain_gpt.py "${ARGS[@]}"
