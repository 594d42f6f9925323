"""The checks a ParallelLayout makes before it exists: each refusal names the flags and the fix
(ParallelConfigError), before any process group is built."""
from .errors import ParallelConfigError


def check_dense(world, tp, cp, pp, vpp):
    """TP, CP, PP and virtual stages fit `world` ranks."""
    if tp < 1 or pp < 1:
        raise ParallelConfigError(f"--tensor-model-parallel-size ({tp}) and --pipeline-model-parallel-size ({pp}) "
                                  "must be at least 1")
    if cp < 1:
        raise ParallelConfigError(f"--context-parallel-size ({cp}) must be at least 1")
    if cp > 1 and world % (tp * cp * pp) != 0:
        raise ParallelConfigError(
            f"world size {world} is not divisible by --tensor-model-parallel-size {tp} x "
            f"--context-parallel-size {cp} x --pipeline-model-parallel-size {pp} = {tp * cp * pp}; launch a "
            f"multiple of {tp * cp * pp} processes or change the parallel sizes")
    if world % (tp * pp) != 0:
        raise ParallelConfigError(
            f"world size {world} is not divisible by --tensor-model-parallel-size {tp} x "
            f"--pipeline-model-parallel-size {pp} = {tp * pp}; launch a multiple of {tp * pp} "
            "processes or change the parallel sizes")
    if vpp is not None and vpp > 1 and pp < 2:
        raise ParallelConfigError("--num-virtual-stages-per-pipeline-rank (virtual pipeline stages) needs "
                                  "--pipeline-model-parallel-size of at least 2")


def check_experts(tp, dp_cp, ep, etp, folded):
    """Expert groups are carved out of DP x CP (ETP = TP), or re-split TP x DP x CP (folded)."""
    if folded:
        if ep < 1 or etp < 1 or (tp * dp_cp) % (etp * ep):
            raise ParallelConfigError(
                f"--expert-tensor-parallel-size ({etp}) x --expert-model-parallel-size ({ep}) must divide "
                f"--tensor-model-parallel-size x the data-parallel size ({tp} x {dp_cp}): the experts re-split "
                "those ranks; change them or launch more processes")
    elif ep < 1 or dp_cp % ep:
        raise ParallelConfigError(
            f"--expert-model-parallel-size ({ep}) must divide the data-parallel size ({dp_cp}): expert-parallel "
            "groups are carved out of the data-parallel ranks; change it or launch more processes")

