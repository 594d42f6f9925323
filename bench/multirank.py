"""Several ranks on one machine's devices against one process, through the CLI: TP2 + SP, PP2, CP2 (each
--cp-comm-type), DP2 with ZeRO-3, EP2, at 2 ranks and 4 (TP2 x PP2, DP4 ZeRO-3) sharing the one lent GPU over
gloo (NCCL refuses two ranks on a device). Each case's fp32 losses and grad norms are compared with the one
process's (<= 2e-6 relative at iteration 1, <= 1e-5 over the run) and, in bf16, within bf16's rounding.
Prints one `RESULT {json}` line per case and a table; the GPU suite's `--only multirank` runs it.

    python bench/multirank.py [--device cuda|cpu] [--only NAME,...] [--dry-run]

On a CPU machine the same cases run on gloo (what the CPU test suite proves already): a check of this script.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ("--mock-data --tokenizer-type NullTokenizer --vocab-size 1000 --num-layers 4 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 64 --micro-batch-size 2 --global-batch-size 8 --train-iters 4 "
        "--log-interval 1 --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --lr 1e-3 --seed 7 "
        "--distributed-backend gloo")
MOE = " --num-experts 4 --moe-router-topk 2 --disable-bias-linear --moe-aux-loss-coeff 1e-2"
CASES = {  # name: (ranks, layout flags, model flags)
    "tp2-sp": (2, "--tensor-model-parallel-size 2 --sequence-parallel", ""),
    "pp2": (2, "--pipeline-model-parallel-size 2", ""),
    **{f"cp2-{t}": (2, f"--context-parallel-size 2 --cp-comm-type {t}", "") for t in ("p2p", "a2a", "allgather")},
    "dp2-zero3": (2, "--data-parallel-sharding-strategy optim_grads_params", ""),
    "ep2": (2, "--expert-model-parallel-size 2", MOE),
    "tp2-pp2": (4, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2", ""),
    "dp4-zero3": (4, "--data-parallel-sharding-strategy optim_grads_params", ""),
}
PRECISIONS = {"fp32": ("", 2e-6, 1e-5), "bf16": (" --bf16", 2e-2, 5e-2)}  # bf16: a few roundings of 2^-8


def command(ranks, flags, metrics):
    launcher = f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node {ranks}" if ranks > 1 \
        else sys.executable
    return f"{launcher} pretrain_gpt.py {BASE} {flags} --log-metrics-jsonl {metrics}"


def run(ranks, flags, device):
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(command(ranks, flags, path), shell=True, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    os.remove(path)
    train = {r["iteration"]: r for r in records if r["type"] == "train"}
    return proc, train


def compare(ref, got):
    """(relative difference at iteration 1, largest over the run) of the losses and grad norms."""
    def rel(it):
        r, g = ref[it], got[it]
        pairs = [(g["losses"][k], v) for k, v in r["losses"].items()] + [(g["grad_norm"], r["grad_norm"])]
        return max(abs(a - b) / abs(b) for a, b in pairs)
    return rel(1), max(rel(it) for it in ref)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--only", default=None, help="comma-separated case names")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    a = p.parse_args(argv)
    names = [n for n in CASES if not a.only or n in a.only.split(",")]
    rows = []
    for precision in a.precisions.split(","):
        extra, first_tol, run_tol = PRECISIONS[precision]
        refs = {}
        for name in names:
            ranks, layout, model = CASES[name]
            if a.dry_run:
                print(f"{precision} {name}: {command(ranks, layout + model + extra, 'M.jsonl')}")
                continue
            if model not in refs:
                proc, refs[model] = run(1, model + extra, a.device)
                if proc.returncode or not refs[model]:
                    print(proc.stdout[-2000:] + proc.stderr[-3000:])
            proc, got = run(ranks, layout + model + extra, a.device)
            row = {"case": name, "precision": precision, "ranks": ranks, "rc": proc.returncode}
            if proc.returncode == 0 and got and refs[model] and sorted(got) == sorted(refs[model]):
                row["first"], row["run"] = compare(refs[model], got)
                row["ok"] = row["first"] <= first_tol and row["run"] <= run_tol
            else:
                row["ok"], row["error"] = False, (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
            rows.append(row)
            print("RESULT " + json.dumps(row), flush=True)
    if rows:
        print("| case | precision | ranks | rel. diff it. 1 | max over run | ok |\n|---|---|---:|---:|---:|---|")
        for r in rows:
            ok = "yes" if r["ok"] else "NO: " + r.get("error", "out of bounds")
            print(f"| {r['case']} | {r['precision']} | {r['ranks']} | {r.get('first', float('nan')):.2e} | "
                  f"{r.get('run', float('nan')):.2e} | {ok} |")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
