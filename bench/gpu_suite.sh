#!/usr/bin/env bash
# Everything worth knowing from a lent GPU, in one call of at most 8 minutes, no downloads:
# build the kernels, tests/gpu, the kernel table, ours vs plain PyTorch vs peers at the 1.3B GPT,
# 1B Llama and small-MoE shapes, the planner against the measurement. Tables: OUT/gpu_<card>.md.
#   bash bench/gpu_suite.sh [--out DIR] [--budget SECONDS] [--only step,step] [--label TEXT]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python3 bench/gpu_suite.py "$@"
