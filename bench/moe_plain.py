"""Ours vs a plain PyTorch MoE loop at examples/moe/train_moe_seed004.sh's shape (the GPU suite's entry).

    PYTHONPATH=. python bench/moe_plain.py --device cuda --dtype bf16

bench/overhead.py with --preset moe-seed004 (6 layers, hidden 384, 8 heads, 8 experts of 1536, top-2,
seq 1024, vocab 50304, micro batch 4 x 4, Switch aux loss 1e-2 and z-loss 1e-3; the plain model is
bench/plain_moe_model.py's); every other flag is overhead.py's and passed on.
"""
import sys

from bench import overhead

if __name__ == "__main__":
    sys.exit(overhead.main(["--preset", "moe-seed004", *sys.argv[1:]]))
