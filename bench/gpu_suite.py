"""Everything worth knowing from a lent GPU, in one call (bench/gpu_suite.sh runs this).

Steps, in order of value, each under its own time cap and all under one budget (default 540 s: one
600 s device call with room for the report): the GPU's two ceilings, building the fused kernels,
tests/gpu (crash-proof: pytest-xdist workers),
compute-sanitizer over the binding-error test, the kernel table (fused vs eager vs compiled, TB/s), the
cross entropy's implementations (bench/cross_entropy.py),
then ours vs a plain PyTorch loop vs peers at the GPT-3 1.3B, Llama 1B and small-MoE shapes, with
the planner's predicted step time and memory next to the measured ones; last (past the default budget:
`--only fp8`), FP8 against bf16 at the 1.3B GPT and a Llama-3 8B layer stack, (`--only muon`) one optimizer
step of AdamW and of Muon + AdamW at 1.3B with Newton-Schulz's share, (`--only fusion`) the opt-in
fusions not yet measured beside the same runs without them, (`--only compile`, `--only optimizer`) the
compiled layers and the precision-aware fused AdamW beside the same runs without them, (`--only multirank`)
2 and 4 ranks sharing the GPU over gloo against one process (bench/multirank.py), and (`--only profile`) a
torch.profiler table of ours and of the compiled plain loop at 1.3B, kernel by kernel. A step whose script or
flag this checkout lacks is reported as such, so the same suite runs on older commits.
Everything goes to OUT: suite.log (all output), gpu_<card>.md (the tables), results.json.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

from gpu_suite_report import CE_FUSION, MUON_STEP, PROFILE_STEP, RN_FUSION, render

PY = sys.executable
GPT13 = ("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048")
LLAMA1 = ("--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --ffn-hidden-size 8192 --seq-length 2048 "
          "--max-position-embeddings 2048 --position-embedding-type rope --normalization RMSNorm --swiglu "
          "--group-query-attention --num-query-groups 8 --disable-bias-linear --untie-embeddings-and-output-weights")
MOE = ("--num-layers 6 --hidden-size 384 --num-attention-heads 8 --ffn-hidden-size 1536 --seq-length 1024 "
       "--max-position-embeddings 1024 --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss "
       "--moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-token-dispatcher-type alltoall --moe-grouped-gemm "
       "--disable-bias-linear")
# a Llama-3 8B layer stack (4 of its 32 layers, its widths): where issue 28 asks FP8 for >= 1.3x bf16 tokens/s
LLAMA8_4L = ("--num-layers 4 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 --seq-length 2048 "
             "--max-position-embeddings 2048 --position-embedding-type rope --normalization RMSNorm --swiglu "
             "--group-query-attention --num-query-groups 8 --disable-bias-linear --untie-embeddings-and-output-weights")
FP8 = "--fp8-format hybrid --fp8-recipe tensorwise"
PA_OPT = "--use-precision-aware-optimizer"
RUN = ("--mock-data --tokenizer-type NullTokenizer --lr 1e-4 --bf16 --hidden-dropout 0 --attention-dropout 0 "
       "--eval-iters 0 --eval-interval 100000 --log-interval 5 --micro-batch-size 4 --global-batch-size 16 "
       "--log-throughput")
# CE_FUSION: Megatron-LM's opt-in speed switch; the rows without it run the defaults a Megatron-LM user gets
# bench/overhead.py's timing and output options (its --preset gives the shape)
OVERHEAD = "--device cuda --dtype bf16 --rounds 2 --steps-per-round 2 --warmup 2 --plain-optim fused --no-write"


def steps(out, help_text):
    """(name, cap seconds, shell command or None with the reason) for each step."""
    has = lambda path: os.path.exists(path)  # noqa: E731
    ce = CE_FUSION in help_text["pretrain"]
    fp8 = "--fp8-format" in help_text["pretrain"]
    ovh = help_text["overhead"]
    ovh_ce = CE_FUSION in ovh and "--preset" in ovh
    table = os.path.join(out, "kernel_table.json")
    kjson = os.path.join(out, "kernels.json")
    kernel_args = ""
    if "--json" in help_text["kernels"]:
        kernel_args += f" --json {kjson}"
    if "--write-table" in help_text["kernels"]:
        kernel_args += f" --write-table {table}"
    # the figures the kernels step just measured, when it wrote them (a table named but missing is an error)
    env = (f"env $(test -f {table} && echo MEGATRON_KERNEL_TABLE={table}) " if "--write-table" in help_text["kernels"]
           else "")
    pre = f"{env}{PY} pretrain_gpt.py {RUN}"

    def overhead(preset, extra=""):
        if "--preset" not in ovh:
            return None, "bench/overhead.py has no --preset here"
        return f"{env}{PY} bench/overhead.py --preset {preset} {OVERHEAD}{extra}"
    sanitizer = "compute-sanitizer" if subprocess.run("command -v compute-sanitizer", shell=True,
                                                      capture_output=True).returncode == 0 else None
    return [
        ("ceilings", 40, f"{PY} bench/gpu_ceilings.py"),
        ("build", 200, f"{PY} -m pip install -q --no-deps --no-build-isolation -e ."),
        # test_kernel_speed times what the kernels step times (with torch.compile: minutes): not twice
        ("tests/gpu", 200, f"{PY} -m pytest -q -p no:cacheprovider -n 4 tests/gpu "
                           "--ignore tests/gpu/test_kernel_speed.py"),
        ("sanitizer", 120, (f"{sanitizer} --tool memcheck --target-processes all --print-limit 10 "
                            f"{PY} -m pytest -q -p no:cacheprovider "
                            + ("tests/gpu/test_kernel_bindings.py" if has("tests/gpu/test_kernel_bindings.py")
                               else "tests/gpu/test_kernels.py -k errors"))
                           if sanitizer else (None, "no compute-sanitizer")),
        ("kernels", 150, f"{PY} bench/kernels.py --out {out}/kernels.md{kernel_args}"),
        # the loss's three implementations at the 1.3B step's logits, each checked against the unfused one first
        ("cross entropy", 90, f"{PY} bench/cross_entropy.py" if has("bench/cross_entropy.py")
         else (None, "no bench/cross_entropy.py here")),
        ("gpt1.3b ours", 120, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15"),
        ("gpt1.3b ours vs plain", 150, overhead("gpt-1.3b")),
        (f"gpt1.3b ours {CE_FUSION}", 120, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15 {CE_FUSION}"
         if ce else (None, f"pretrain_gpt.py has no {CE_FUSION} here")),
        (f"gpt1.3b ours {CE_FUSION} vs plain", 150, overhead("gpt-1.3b", f" {CE_FUSION}")
         if ovh_ce else (None, f"bench/overhead.py has no {CE_FUSION} here")),
        ("gpt1.3b plain compiled", 170, overhead("gpt-1.3b", " --models ours --compile")
         if "--compile" in ovh else (None, "bench/overhead.py has no --compile here")),
        ("gpt1.3b HF", 120, f"{PY} bench/peers.py --device cuda --steps 4"),
        ("llama1b ours", 100, f"{pre} {LLAMA1} --vocab-size 50304 --train-iters 15"),
        ("llama1b ours vs plain", 150, overhead("llama-1b")),
        ("moe ours", 100, f"{pre} {MOE} --vocab-size 50257 --train-iters 20"),
        ("moe ours vs plain", 120, f"{env}{PY} bench/moe_plain.py {OVERHEAD}"
         if has("bench/moe_plain.py") else (None, "no bench/moe_plain.py here")),
        # FP8 (docs/fp8.md), last: past the default budget; `--only fp8` runs these four
        ("gpt1.3b ours fp8", 120, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15 {FP8}" if fp8
         else (None, "pretrain_gpt.py has no --fp8-format here")),
        ("fp8 baseline: llama8b-4L ours bf16", 120, f"{pre} {LLAMA8_4L} --vocab-size 32000 --train-iters 15"),
        ("llama8b-4L ours fp8", 120, f"{pre} {LLAMA8_4L} --vocab-size 32000 --train-iters 15 {FP8}" if fp8
         else (None, "pretrain_gpt.py has no --fp8-format here")),
        ("llama8b-4L ours fp8 delayed", 120,
         f"{pre} {LLAMA8_4L} --vocab-size 32000 --train-iters 15 --fp8-format hybrid --fp8-recipe delayed" if fp8
         else (None, "pretrain_gpt.py has no --fp8-format here")),
        # one optimizer step, AdamW against Muon + AdamW at 1.3B, Newton-Schulz's share (`--only muon`: past the budget)
        (MUON_STEP, 150, f"{PY} bench/muon_step.py --shape gpt1.3b --device cuda --bf16"
         if has("bench/muon_step.py") else (None, "no bench/muon_step.py here")),
        # opt-in fusions not yet measured, each beside the same run without it (`--only fusion`: past the budget;
        # the cross entropy's rows above match it too)
        ("fusion baseline: gpt1.3b ours", 120, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15"),
        (f"fusion: gpt1.3b ours {RN_FUSION}", 120, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15 {RN_FUSION}"
         if RN_FUSION in help_text["pretrain"] else (None, f"pretrain_gpt.py has no {RN_FUSION} here")),
        ("fusion baseline: llama1b ours", 100, f"{pre} {LLAMA1} --vocab-size 50304 --train-iters 15"),
        (f"fusion: llama1b ours {RN_FUSION}", 100, f"{pre} {LLAMA1} --vocab-size 50304 --train-iters 15 {RN_FUSION}"
         if RN_FUSION in help_text["pretrain"] else (None, f"pretrain_gpt.py has no {RN_FUSION} here")),
        # packed documents: the attention core with document boundaries vs a dense mask vs causal (`--only packing`)
        ("packing", 120, f"{PY} bench/packing.py --device cuda --dtype bfloat16 --heads 16 --groups 8 --head-dim 128 "
                         f"--rounds 5 --out {out}/packing.md" if has("bench/packing.py")
         else (None, "no bench/packing.py here")),
        # compiled layers and the precision-aware fused AdamW, each beside the same run without it (`--only compile`,
        # `--only optimizer`: past the budget); the distributed optimizer at DP1 is what the fused step needs
        ("compile baseline: gpt1.3b ours", 120, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15"),
        ("compile: gpt1.3b ours --compile-layers", 200, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15 "
         "--compile-layers" if "--compile-layers" in help_text["pretrain"]
         else (None, "pretrain_gpt.py has no --compile-layers here")),
        ("compile: llama1b ours --compile-layers", 200, f"{pre} {LLAMA1} --vocab-size 50304 --train-iters 15 "
         "--compile-layers" if "--compile-layers" in help_text["pretrain"]
         else (None, "pretrain_gpt.py has no --compile-layers here")),
        ("optimizer baseline: gpt1.3b ours distopt", 120, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15 "
         "--use-distributed-optimizer"),
        (f"optimizer: gpt1.3b ours {PA_OPT}", 120, f"{pre} {GPT13} --vocab-size 50304 --train-iters 15 "
         f"--use-distributed-optimizer {PA_OPT}" if PA_OPT in help_text["pretrain"]
         else (None, f"pretrain_gpt.py has no {PA_OPT} here")),
        ("optimizer: gpt1.3b compiled layers + fused AdamW bf16 moments", 200, f"{pre} {GPT13} --vocab-size 50304 "
         f"--train-iters 15 --use-distributed-optimizer {PA_OPT} --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 "
         "--compile-layers" if PA_OPT in help_text["pretrain"] and "--compile-layers" in help_text["pretrain"]
         else (None, "pretrain_gpt.py lacks the flags here")),
        # 2 and 4 ranks sharing the one GPU over gloo against one process (`--only multirank`: past the budget)
        ("multirank fp32", 250, f"{PY} bench/multirank.py --device cuda --precisions fp32" if has("bench/multirank.py")
         else (None, "no bench/multirank.py here")),
        ("multirank bf16", 150, f"{PY} bench/multirank.py --device cuda --precisions bf16 "
         "--only tp2-sp,pp2,dp2-zero3,ep2" if has("bench/multirank.py") else (None, "no bench/multirank.py here")),
        # where ours and the compiled plain loop spend GPU time, kernel by kernel (`--only profile`: past the budget)
        (PROFILE_STEP, 200, overhead("gpt-1.3b", " --models ours --compile --profile --rounds 1 --steps-per-round 1")
         if "--profile" in ovh else (None, "bench/overhead.py has no --profile here")),
    ]


def help_of(cmd):
    # the scripts import bench.* and megatron from the checkout, as the steps do (run_step's PYTHONPATH)
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60, env=env).stdout
    except subprocess.TimeoutExpired:
        return ""


def run_step(name, cap, cmd, log):
    log.write(f"\n### {name} (cap {cap} s): {cmd}\n")
    log.flush()
    t0 = time.time()
    # a session of its own, so that a step at its cap is killed with every process it started
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.getcwd()}
    try:
        proc = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env=env)
        try:
            text, _ = proc.communicate(timeout=cap)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
            rc = "timeout"
    except Exception as e:  # noqa: BLE001 - one step's failure must not stop the suite
        text, rc = f"{type(e).__name__}: {e}\n", "error"
    log.write(text)
    log.write(f"### {name}: rc={rc} in {time.time() - t0:.0f} s\n")
    log.flush()
    print(f"[suite] {name}: rc={rc} in {time.time() - t0:.0f} s", flush=True)
    return {"name": name, "rc": rc, "seconds": round(time.time() - t0, 1), "output": text,
            "results": [json.loads(m) for m in re.findall(r"^RESULT (\{.*\})$", text, re.M)]}


def help_texts():
    """Each script's --help: the suite asks for the flags a checkout has."""
    return {name: help_of(f"{PY} {script} --help") for name, script in
            (("pretrain", "pretrain_gpt.py"), ("kernels", "bench/kernels.py"), ("overhead", "bench/overhead.py"))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/results/gpu_suite")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for all steps together")
    p.add_argument("--only", default=None, help="comma-separated step names (substring match)")
    p.add_argument("--skip", default=None, help="comma-separated step names (exact) to leave out")
    p.add_argument("--label", default=None, help="what was measured (e.g. the commit), for the report")
    p.add_argument("--dry-run", action="store_true", help="print each step's command (no GPU needed) and exit")
    a = p.parse_args(argv)
    help_text = help_texts()
    if a.dry_run:
        for name, cap, cmd in steps(a.out, help_text):
            print(f"{name} (cap {cap} s): " + (f"skipped: {cmd[1]}" if isinstance(cmd, tuple) else cmd))
        return 0
    os.makedirs(a.out, exist_ok=True)
    start = time.time()
    done = []
    with open(os.path.join(a.out, "suite.log"), "w") as log:
        for name, cap, cmd in steps(a.out, help_text):
            if a.only and not any(k in name for k in a.only.split(",")):
                continue
            if a.skip and name in a.skip.split(","):
                continue
            left = a.budget - (time.time() - start)
            if isinstance(cmd, tuple):
                done.append({"name": name, "rc": "n/a", "skipped": cmd[1]})
            elif left < min(cap, 30):
                done.append({"name": name, "rc": "n/a", "skipped": f"budget ({left:.0f} s left)"})
            else:
                done.append(run_step(name, int(min(cap, left)), cmd, log))
    label = a.label or subprocess.run("git rev-parse --short HEAD", shell=True, capture_output=True,
                                      text=True).stdout.strip() or "unknown"
    with open(os.path.join(a.out, "results.json"), "w") as f:  # first: whatever the report does
        json.dump([{k: v for k, v in d.items() if k != "output"} for d in done], f, indent=1)
    try:
        card, text = render(done, label, a.out)
    except Exception as e:  # noqa: BLE001 - the log and results.json hold everything; say why no tables
        card, text = "gpu", f"# GPU suite ({label}): the report failed ({type(e).__name__}: {e}); see suite.log\n"
    with open(os.path.join(a.out, f"gpu_{card}.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"[suite] {time.time() - start:.0f} s in all; wrote {a.out}/gpu_{card}.md", flush=True)


if __name__ == "__main__":
    main()
