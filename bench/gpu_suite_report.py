"""The GPU suite's report: reads each step's output (bench/gpu_suite.py) and writes the markdown tables."""
import datetime
import os
import re
import statistics

CE_FUSION = "--cross-entropy-loss-fusion"
RN_FUSION = "--residual-norm-fusion"
# bench/gpu_suite.py's steps whose output is a pretrain_gpt.py log, and those printing bench/overhead.py's tables
PRETRAIN_STEPS = ("gpt1.3b ours", f"gpt1.3b ours {CE_FUSION}", "llama1b ours", "moe ours", "gpt1.3b ours fp8",
                  "fp8 baseline: llama8b-4L ours bf16", "llama8b-4L ours fp8", "llama8b-4L ours fp8 delayed",
                  "fusion baseline: gpt1.3b ours", f"fusion: gpt1.3b ours {RN_FUSION}",
                  "fusion baseline: llama1b ours", f"fusion: llama1b ours {RN_FUSION}",
                  "compile baseline: gpt1.3b ours", "compile: gpt1.3b ours --compile-layers",
                  "compile: llama1b ours --compile-layers", "optimizer baseline: gpt1.3b ours distopt",
                  "optimizer: gpt1.3b ours --use-precision-aware-optimizer",
                  "optimizer: gpt1.3b compiled layers + fused AdamW bf16 moments")
PROFILE_STEP = "profile gpt1.3b ours vs plain compiled"
MUON_STEP = "muon optimizer step gpt1.3b"  # bench/muon_step.py: its table follows the overhead ones
OVERHEAD_STEPS = ("gpt1.3b ours vs plain", f"gpt1.3b ours {CE_FUSION} vs plain", "gpt1.3b plain compiled",
                  "llama1b ours vs plain", "moe ours vs plain", PROFILE_STEP)

ITER = re.compile(r"elapsed time per iteration \(ms\): ([\d.]+) \| throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)"
                  r"(?: \| MFU: ([\d.]+)%)?")
PLANNER = re.compile(r"planner \(.*?\): predicted ([\d.]+) s per iteration.*?([\d.]+) GB on the most loaded GPU")
MAX_ALLOC = re.compile(r"max allocated: ([\d.]+)")


def card_of(done):
    for d in done:
        for r in d.get("results", []):
            if "device" in r:
                name = r["device"]
                m = re.search(r"\b([A-Z]\d{2,3}[A-Z]?)\b", name)
                return (m.group(1).lower() if m else re.sub(r"\W+", "_", name).lower()), name
    return "gpu", "unknown GPU"


def pretrain_row(d):
    """(ms, TFLOP/s, MFU %, planner s, planner GB, measured max-allocated GB, implementations) of a run."""
    out = d.get("output", "")
    its = ITER.findall(out)[1:]  # the first logged interval holds warm-up
    ms = statistics.median(float(i[0]) for i in its) if its else None
    tf = statistics.median(float(i[1]) for i in its) if its else None
    mfu = statistics.median(float(i[2]) for i in its if i[2]) if its and its[0][2] else None
    plan = PLANNER.search(out)
    mem = MAX_ALLOC.findall(out)
    impl = re.search(r"implementations: (.*)", out)
    return (ms, tf, mfu, float(plan.group(1)) * 1e3 if plan else None, float(plan.group(2)) if plan else None,
            max(float(m) for m in mem) / 1024 if mem else None, impl.group(1) if impl else "")


def fmt(x, spec=".1f", none="n/a"):
    return none if x is None else format(x, spec)


def tables_of(text):
    """Markdown table lines and ratio lines a bench printed."""
    return [ln for ln in text.splitlines() if ln.startswith("|") or ln.startswith("ratio ")]


def profile_blocks(text, rows=45):
    """bench/overhead.py --profile's tables (each from its "==== profile" line), indented as code."""
    out, keep = [], 0
    for ln in text.splitlines():
        if ln.startswith("==== profile"):
            out += ["", f"#### {ln.strip('= ')}", ""]
            keep = rows
        elif keep:
            out.append("    " + ln)
            keep -= 1
    return out


def render(done, label, out):
    card, device = card_of(done)
    lines = [f"# GPU suite: {device} ({label})", "",
             f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}; command: `bash bench/gpu_suite.sh`", ""]
    lines += ["## Steps", "", "| step | rc | seconds | note |", "|---|---|---:|---|"]
    for d in done:
        lines.append(f"| {d['name']} | {d['rc']} | {d.get('seconds', '')} | {d.get('skipped', '')} |")
    by = {d["name"]: d for d in done}
    ceil = next((r for d in done for r in d.get("results", []) if "copy_tb_s" in r), None)
    if ceil:
        lines += ["", f"Ceilings measured in this run: device-to-device copy {ceil['copy_tb_s']} TB/s, "
                      f"bf16 GEMM 8192^3 {ceil['bf16_gemm_tflops']} TFLOP/s "
                      f"(torch {ceil['torch']}, CUDA {ceil['cuda']})."]
    tests = by.get("tests/gpu", {}).get("output", "")
    if tests:
        summary = [ln for ln in tests.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        failed = [ln for ln in tests.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        lines += ["", "## tests/gpu", "", *(f"    {ln}" for ln in summary[-1:] + failed[:20])]
    san = by.get("sanitizer", {}).get("output", "")
    if san:
        keep = [ln for ln in san.splitlines() if "ERROR SUMMARY" in ln or ln.startswith("=========") and
                ("Invalid" in ln or "Address" in ln or "at " in ln)][:15]
        lines += ["", "## compute-sanitizer (memcheck) over the binding-error test", "", *(f"    {ln}" for ln in keep)]
    kmd = os.path.join(out, "kernels.md")
    if os.path.exists(kmd):
        with open(kmd) as f:
            lines += ["", "## Kernels", ""] + [ln for ln in f.read().splitlines() if not ln.startswith("# ")]
    ce = by.get("cross entropy", {}).get("output", "")
    if ce:
        lines += ["", "## Cross entropy (bench/cross_entropy.py)", "",
                  *[ln for ln in ce.splitlines() if ln.startswith("- ")], *tables_of(ce)]
    lines += ["", "## End to end (bf16, one GPU)", "",
              "| run | ms/step | TFLOP/s | MFU % | max allocated GB | planner ms | planner GB |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    impls = []
    for name in PRETRAIN_STEPS:
        if name in by and by[name].get("output"):
            ms, tf, mfu, pms, pgb, mem, impl = pretrain_row(by[name])
            lines.append(f"| {name} (pretrain_gpt.py) | {fmt(ms)} | {fmt(tf)} | {fmt(mfu)} | {fmt(mem)} | "
                         f"{fmt(pms)} | {fmt(pgb)} |")
            impls.append(f"- {name}: {impl}")
    for d in done:
        for r in d.get("results", []):
            if "ms_per_step" in r:
                lines.append(f"| {r['name']} | {r['ms_per_step']} | {r.get('tflops', 'n/a')} | "
                             f"{fmt(r['mfu'] * 100 if r.get('mfu') else None)} | {fmt(r.get('peak_mem_gib'))} | | |")
    for name in OVERHEAD_STEPS + (MUON_STEP,):
        text = by.get(name, {}).get("output", "")
        if text:
            lines += ["", f"### {name}", "", *tables_of(text), *profile_blocks(text)]
    if impls:
        lines += ["", "Implementations (start-up log):", "", *impls]
    return card, "\n".join(lines) + "\n"
