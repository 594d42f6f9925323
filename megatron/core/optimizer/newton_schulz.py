"""Newton-Schulz orthogonalisation (Muon's core) and Muon's update scale, as Megatron-Core runs them.

For a matrix G (rows >= cols is transposed first, so the Gram matrix is the small side's), with
X_0 = G / max(||G||_F, eps) and per step k coefficients (a_k, b_k, c_k):

    A = X X^T,   X <- a_k X + (b_k A + c_k A A) X

which drives every singular value of X towards about 1 and keeps the singular vectors: X -> ~U V^T.
The polynomial is odd, so the result on G^T is the transpose of the result on G, and permuting G's
rows permutes the result's rows the same way: a matrix gathered from TP shards in any row order gives
the same function as the whole matrix.

Distributed form (`group`): X's columns are split over the group; the Gram matrix and the Frobenius
norm are sums over the columns, all-reduced at each step, and each rank keeps its columns.
"""
import torch

from .. import comm

# per-step (a, b, c); a set shorter than the steps repeats (its length must divide them), but "simple"
# (one triple, any number of steps) and "polar_express" (at least its 8 steps, the last one repeated)
COEFFICIENTS = {
    "simple": ((3.4445, -4.7750, 2.0315),),
    # Keller Jordan's tuned quintic (modded-nanogpt), per step
    "quintic": ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)),
    # Amsel et al. 2025, arXiv:2505.16932
    "polar_express": ((8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
                      (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                      (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)),
    "aol": ((4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
            (2.7215, -3.0494, 1.3169)),
}
SCALE_MODES = ("spectral", "unit_rms_norm", "shape_scaling")
EPS = 1e-7


def coefficient_schedule(kind: str, steps: int):
    """The (a, b, c) of each of `steps` steps. ValueError naming the rule for a kind or count that does not fit."""
    if kind not in COEFFICIENTS:
        raise ValueError(f"unknown Newton-Schulz coefficient type {kind!r}: one of {', '.join(COEFFICIENTS)}")
    if steps < 1:
        raise ValueError(f"{steps} Newton-Schulz steps: at least 1")
    sets = COEFFICIENTS[kind]
    if kind == "simple":
        return list(sets) * steps
    if kind == "polar_express":
        if steps < len(sets):
            raise ValueError(f"polar_express coefficients take at least {len(sets)} Newton-Schulz steps, not {steps}")
        return list(sets) + [sets[-1]] * (steps - len(sets))
    if steps % len(sets):
        raise ValueError(f"{kind} coefficients take a multiple of {len(sets)} Newton-Schulz steps, not {steps}")
    return list(sets) * (steps // len(sets))


def scale_factor(rows: int, cols: int, mode: str) -> float:
    """The factor on the orthogonalised update of a rows x cols matrix (the whole matrix's sizes).
    spectral: sqrt(max(rows, cols)), an update of RMS ~1 (Kimi's Moonlight); unit_rms_norm: sqrt(rows / cols)
    (Scion); shape_scaling: sqrt(max(1, rows / cols)) (Keller Jordan's Muon)."""
    if mode == "spectral":
        return max(rows, cols) ** 0.5
    if mode == "unit_rms_norm":
        return (rows / cols) ** 0.5
    if mode == "shape_scaling":
        return max(1.0, rows / cols) ** 0.5
    raise ValueError(f"unknown Muon scale mode {mode!r}: one of {', '.join(SCALE_MODES)}")


def _sum_(t, group):
    return comm.all_reduce_(t, group, tag="muon-tp") if group is not None else t


def newton_schulz(x, schedule, transpose=None, group=None, dtype=torch.float32):
    """The orthogonalised fp32 matrix of x (2-D) under `schedule` (coefficient_schedule).

    transpose: run on x^T (None: when x has more rows than columns). group: x^T's (or x's) columns are
    this rank's share of a matrix split over `group` (the distributed TP mode): Gram matrices and the norm
    are all-reduced. dtype: of the matmuls (bf16 as Megatron-Core's fp32 matmul precision 'medium' on a GPU)."""
    if x.ndim != 2:
        raise ValueError(f"Newton-Schulz takes a matrix, not a {x.ndim}-D tensor")
    if transpose is None:
        transpose = x.shape[0] > x.shape[1]
    X = (x.mT if transpose else x).float()
    norm = _sum_((X * X).sum(), group).sqrt().clamp_min(EPS)
    X = (X / norm).to(dtype)
    for a, b, c in schedule:
        A = _sum_(X @ X.mT, group)
        B = torch.addmm(A, A, A, beta=b, alpha=c)
        X = torch.addmm(X, B, X, beta=a, alpha=1.0)
    X = X.float()
    return X.mT if transpose else X
