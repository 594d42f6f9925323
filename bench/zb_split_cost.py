"""What the zero-bubble backward split costs on CPU: one pipeline stage's step (M microbatches of a GPT
chunk, hidden states in and out), ordinary backward vs split into B and W, for this tree and, with
--baseline DIR, another source tree (e.g. `git archive` of a commit before the split moved onto the
autograd graph), interleaved in one run.

    PYTHONPATH=. python bench/zb_split_cost.py --baseline /tmp/old_tree [--moe]

Each tree runs in its own process (its own import of megatron, one thread) and times with the
process's CPU clock (time.process_time: other jobs on shared cores do not count); rounds alternate the
trees so what noise is left hits both alike. A step: the M forwards, then per microbatch its backward:
ordinary, or B then W. The split is this tree's (pipeline_parallel/backward_split.py) or, in a tree
that has it, the per-layer one (tensor_parallel/weight_grad.py, its forwards inside splitting()).
Reported per tree: median ms per step, ordinary and split, the split's overhead (split / ordinary - 1),
and B's and W's shares. Written to bench/results/zb_split_cost_cpu[_moe].md.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model(a):
    import types

    from megatron.core.comm import PlanGroup
    from megatron.core.config import TransformerConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.initialization import initialize_parameters
    moe = dict(num_experts=8, moe_ffn_hidden_size=a.hidden, moe_router_topk=2, moe_grouped_gemm=True) if a.moe else {}
    cfg = TransformerConfig(num_layers=a.layers, hidden_size=a.hidden, num_attention_heads=8, seq_length=a.seq,
                            vocab_size=256, hidden_dropout=0.0, attention_dropout=0.0, **moe)
    cfg.validate()
    groups = types.SimpleNamespace(tp=PlanGroup(1, 0), tp_size=1, tp_rank=0, pp_size=1, pp_rank=0)
    model = GPTModel(cfg, groups, pre_process=False, post_process=False)
    initialize_parameters(model, 1, 0, 1)
    return model


def _split_fns(model):
    """(forward context, B(out, grad, inp) -> work, W(work)) of this tree's split."""
    import contextlib
    try:
        from megatron.core.pipeline_parallel.backward_split import backward_input
    except ImportError:  # a tree with the per-layer split
        from megatron.core.tensor_parallel import weight_grad

        def b(out, grad, inp):
            with weight_grad.splitting(), weight_grad.deferring() as work:
                out.backward(grad)
            return work
        return weight_grad.splitting, b, weight_grad.apply
    order = {id(p): i for i, p in enumerate(model.parameters())}
    return contextlib.nullcontext, lambda out, grad, inp: backward_input(out, grad, inp, order), lambda w: w.run()


def worker(a):
    import torch
    torch.set_num_threads(1)
    from megatron.core.transformer.moe import aux_losses
    model = _model(a)
    fwd_ctx, b_fn, w_fn = _split_fns(model)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(a.seq, a.micro_batch, a.hidden, generator=g), torch.randn(a.seq, a.micro_batch, a.hidden,
                                                                                   generator=g))
            for _ in range(a.microbatches)]
    ids = torch.zeros(a.micro_batch, a.seq, dtype=torch.long)  # a middle stage reads only their shape
    times = {"ordinary": [], "split": [], "b": [], "w": []}
    for step in range(a.steps + 1):  # the first is a warm-up
        for split in (False, True):
            aux_losses.start_iteration(1.0, a.microbatches)
            t0 = time.process_time()
            with fwd_ctx() if split else torch.enable_grad():
                inps = [x.clone().requires_grad_() for x, _ in data]
                outs = [model(ids, hidden_states=inp) for inp in inps]
            tb = tw = 0.0
            for out, inp, (_, gy) in zip(outs, inps, data):
                t1 = time.process_time()
                if not split:
                    out.backward(gy)
                    continue
                work = b_fn(out, gy, inp)
                t2 = time.process_time()
                w_fn(work)
                tb, tw = tb + t2 - t1, tw + time.process_time() - t2
            del outs, inps
            if step:
                times["split" if split else "ordinary"].append(time.process_time() - t0)
                if split:
                    times["b"].append(tb)
                    times["w"].append(tw)
            model.zero_grad(set_to_none=True)
    print(json.dumps(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="another source tree to measure in the same run")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--moe", action="store_true", help="MoE layers (8 experts, top 2, grouped GEMM)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    trees = {"this tree": ROOT}
    if a.baseline:
        trees["baseline"] = os.path.abspath(a.baseline)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
            if k in ("layers", "hidden", "seq", "micro_batch", "microbatches", "steps")] + (["--moe"] if a.moe else [])
    got = {name: {"ordinary": [], "split": [], "b": [], "w": []} for name in trees}
    load = os.getloadavg()[0]
    for r in range(a.rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            env = dict(os.environ, PYTHONPATH=trees[name], OMP_NUM_THREADS="1")
            out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "zb_split_cost.py"), "--worker", *args],
                                 env=env, capture_output=True, text=True, check=True, cwd=trees[name])
            for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
                got[name][k] += v
    rows = []
    for name, t in got.items():
        med = {k: 1000 * statistics.median(v) for k, v in t.items()}
        over = 100 * (med["split"] / med["ordinary"] - 1)
        rows.append(f"| {name} | {med['ordinary']:.1f} | {med['split']:.1f} | {over:+.1f} | {med['b']:.1f} "
                    f"| {med['w']:.1f} |")
    text = "\n".join([
        f"# Zero-bubble split cost per step, CPU{' (MoE)' if a.moe else ''}", "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- command: `PYTHONPATH=. python bench/zb_split_cost.py {' '.join(sys.argv[1:])}`",
        f"- GPT middle stage: {a.layers} layers, hidden {a.hidden}, sequence {a.seq}, micro batch {a.micro_batch}, "
        f"{a.microbatches} microbatches per step, fp32, 1 thread; median of {a.rounds} x {a.steps} steps per tree; "
        f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}",
        "- baseline: " + (trees.get("baseline", "none")), "",
        "| tree | ordinary CPU ms/step | split CPU ms/step | split overhead % | B ms | W ms |",
        "|---|---:|---:|---:|---:|---:|", *rows, ""])
    print(text)
    path = os.path.join(ROOT, "bench", "results", f"zb_split_cost_cpu{'_moe' if a.moe else ''}.md")
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
