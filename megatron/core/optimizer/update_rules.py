"""Which update rule (update_rule.py) takes which optimizer piece, for each --optimizer."""
from ..tensor_parallel.param_meta import is_muon_matrix
from .adam import AdamRule
from .muon import MuonConfig, MuonRule
from .precision_aware_adam import PrecisionAwareAdamRule
from .sgd import SGDRule

OPTIMIZERS = ("adam", "sgd", "muon")


def build(name, pieces, groups, ddp, sharded, lr, weight_decay, betas, eps, sgd_momentum=0.9, muon=None,
          precision=None):
    """The rules of optimizer `name` over `pieces` (each piece in exactly one): adam and sgd take all;
    muon takes the hidden matrices (param_meta.is_muon_matrix) and AdamW the rest (--muon-scalar-optimizer
    adam). sharded: the pieces are DP slices (the distributed optimizer). precision: (main params, exp_avg,
    exp_avg_sq) dtypes of the precision-aware AdamW (adam only), or None."""
    if precision is not None:
        if name != "adam":
            raise ValueError(f"the precision-aware optimizer is AdamW's, not {name}'s")
        buckets = [bucket.params for buf in ddp.buffers for bucket in buf.buckets]
        return [PrecisionAwareAdamRule(pieces, lr, weight_decay, betas, eps, precision, buckets)]
    if name == "adam":
        return [AdamRule(pieces, lr, weight_decay, betas, eps)]
    if name == "sgd":
        return [SGDRule(pieces, lr, weight_decay, sgd_momentum)]
    if name != "muon":
        raise ValueError(f"unknown optimizer {name!r}: one of {', '.join(OPTIMIZERS)}")
    matrices = [pc for pc in pieces if is_muon_matrix(pc.param)]
    rest = [pc for pc in pieces if not is_muon_matrix(pc.param)]
    if any(pc.on_host for pc in matrices):
        raise ValueError("Muon's matrices cannot be offloaded to the host (--optimizer-cpu-offload)")
    return [MuonRule(matrices, groups, ddp, sharded, muon or MuonConfig(), lr, weight_decay),
            AdamRule(rest, lr, weight_decay, betas, eps)]
