"""FP8 delayed scaling's state (amax histories, scales, update counts) in the layout-free checkpoint:
a run resumed from a checkpoint continues bitwise, and the checkpoint holds the state of every FP8 linear."""
import pytest
import torch

from .cli import losses, run_cli
from .test_checkpoint import BASE, ITERS, params

FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "3",
       "--fp8-amax-compute-algo", "max"]


# ZeRO-3 at DP2 with --fp8-param-gather: the resumed run casts its FP8 weight shards from the loaded values
# before its first forward (fp8_param_gather.py), with the loaded histories' scales
PARAM_GATHER = ["--data-parallel-sharding-strategy", "optim_grads_params", "--fp8-param-gather"]


@pytest.mark.slow
@pytest.mark.parametrize("layout,nproc", [([], 1), (PARAM_GATHER, 2)], ids=["one-process", "zero3-dp2-param-gather"])
def test_fp8_delayed_resume_is_bitwise_identical(tmp_path, layout, nproc):
    straight_dir, d = str(tmp_path / "straight"), str(tmp_path / "ck")
    flags = BASE + FP8 + layout
    straight = losses(run_cli(flags + ["--save", straight_dir], nproc=nproc).stdout)
    first = losses(run_cli(flags + ["--save", d, "--save-interval", "2", "--exit-interval", str(ITERS // 2)],
                           nproc=nproc).stdout)
    second = losses(run_cli(flags + ["--save", d, "--load", d], nproc=nproc).stdout)
    assert {**first, **second} == straight
    a, b = params(straight_dir), params(d)
    assert a.keys() == b.keys()
    for k in a:  # weights, Adam moments and the FP8 state, bit for bit
        assert torch.equal(a[k], b[k]), k
    fp8 = {k: v for k, v in a.items() if ".fp8." in k[0]}
    # 2 layers x 4 linears x 3 tensors (input, weight, grad) x 3 buffers
    assert len(fp8) == 72, sorted(fp8)
    histories = [v for (key, _), v in fp8.items() if key.endswith("amax_history")]
    assert all(h.shape == (3,) and (h > 0).all() for h in histories)  # ITERS >= 3 steps recorded
    assert all(v.item() == ITERS for (key, _), v in fp8.items() if key.endswith("updates"))


EP2 = ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]
FOLDED_EP4 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1",
              "--expert-model-parallel-size", "4", "--moe-token-dispatcher-type", "allgather"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", [EP2, EP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
                                    EP2 + ["--context-parallel-size", "4"],
                                    EP2 + ["--expert-tensor-parallel-size", "2"], FOLDED_EP4],
                         ids=["ep2-dp4", "ep2-tp2-sp", "ep2-cp4", "folded-etp2-ep2", "folded-tp2-sp-etp1-ep4"])
def test_expert_amax_histories_under_ep_are_one_process(tmp_path, layout):
    """Delayed scaling at EP2 x DP4, EP2 x TP2 (+ SP, DP2) and EP2 x CP4 (alltoall), and folded: expert TP 2 over DP
    ranks at EP2, TP2 + SP with expert TP 1 at EP4 (allgather): after a step each expert's amax histories (its
    input, weight and gradient, reduced over the pieces cast apart, over expert TP for the split tensors, over the
    ranks holding the same experts and rows of the same micro-batches and over expert-DP, the ranks holding the
    same expert) are the one-process run's. Reducing them over
    DP x CP instead mixes the experts that share a local index. At TP2 the gradients' amaxes are held to 1e-3:
    TP's partial sums move fp32 values by an ulp, which flips a few FP8 casts upstream in the backward already in
    iteration 1 (the same 1.2e-4 at TP2 + SP without EP; test_fp8_parity.py's docstring)."""
    from megatron.core.checkpointing import CheckpointReader, find_checkpoint

    from .test_fp8_parity import MOE
    from .test_parity import BASE as NO_DROPOUT  # dropout would draw other masks on other layouts
    flags = NO_DROPOUT + FP8 + MOE + ["--train-iters", "1", "--save-interval", "1", "--global-batch-size", "16"]
    one, ep = str(tmp_path / "one"), str(tmp_path / "ep")
    run_cli(flags + ["--save", one])
    run_cli(flags + ["--save", ep] + layout, nproc=4)
    a, b = CheckpointReader(find_checkpoint(one)), CheckpointReader(find_checkpoint(ep))
    found = [(key, state) for (key, state) in a.index if "local_experts" in key and key.endswith("amax_history")]
    assert len(found) == 2 * 4 * 2 * 3  # layers x experts x (fc1, fc2) x (input, weight, grad)
    for key, state in found:
        x, y = a.global_tensor(key, state), b.global_tensor(key, state)
        tol = 1e-3 if "--tensor-model-parallel-size" in layout and ".grad." in key else 1e-5
        assert x[0] > 0 and torch.allclose(x, y, rtol=tol, atol=0), (key, x, y)
