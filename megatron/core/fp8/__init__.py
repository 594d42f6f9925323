"""FP8 training: formats and scales (formats.py), 1x128 / 128x128 tiles (blockwise.py), GEMMs over
torch._scaled_mm (gemm.py), the scaling recipes (recipes.py, scalers.py), the linear's autograd function
(linear.py). docs/fp8.md explains the recipes and why every layout quantises as one process does."""
