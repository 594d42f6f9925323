"""Where does the CUDA build of megatron_fused_kernels crash on a bad input (issue 27)? One GPU call.

    python tests/gpu/bindings_crash_probe.py [--out FILE]
    python tests/gpu/bindings_crash_probe.py --no-gpu   # a CUDA build of torch, no GPU: every case's checks

Each probe runs in its own subprocess (a crash then ends only that probe) with Python's faulthandler
and torch's fatal-signal handler on, which print the Python and the native (C++) frames of a
SIGSEGV; under gdb as well when gdb is installed. The probes separate the hypotheses that the CPU
machines could not (there every one of them raises; see the report on branch bindcrash):

  cpu-only         a CPU tensor, CUDA never initialised: the throw itself, no CUDA state
  no-number        a bad case whose message has no integer (device "cpu", dtype names)
  integer          messages that format integers (sizes, a device index) through std::ostream
  double           a message that formats a double
  torch-control    torch's own error with sizes in the same process (is it our module only?)
  no-throw         a valid call (the module works at all)

and one run with LD_DEBUG=bindings lists every symbol the module binds to a library other than
itself, libstdc++, libc, libm, libgcc_s, libpython and torch's own: C++ library internals taken
from another copy (libcufile.so.0, preloaded into the global scope by torch, exports an unversioned
static libstdc++) are the leading suspect. Prints one line per probe, then the details of those
that died.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = r"""
import faulthandler, sys, torch
faulthandler.enable()
torch._C._set_print_stack_traces_on_fatal_signal(True)
from megatron.core.fusions import _ext
ext = _ext.load() if {cuda} else __import__("megatron_fused_kernels")
assert ext is not None, _ext.status()
print("module", ext.__file__, flush=True)
"""

CASE = r"""
from tests.kernel_binding_cases import BAD, GOOD, run_case
case = GOOD[{name!r}] if {good} else BAD[{key!r}]
try:
    run_case(ext, case, "cuda")
    torch.cuda.synchronize()
    print("RESULT ok", flush=True)
except Exception as e:
    print("RESULT", type(e).__name__ + ":", str(e).splitlines()[0], flush=True)
"""

CPU_ONLY = r"""
try:
    ext.bias_gelu_forward(torch.zeros(2, 4), None)
    print("RESULT ok", flush=True)
except Exception as e:
    print("RESULT", type(e).__name__ + ":", str(e).splitlines()[0], flush=True)
"""

TORCH_CONTROL = r"""
try:
    torch.zeros(2, 3, device="cuda") + torch.zeros(4, device="cuda")
    print("RESULT ok", flush=True)
except Exception as e:
    print("RESULT", type(e).__name__ + ":", str(e).splitlines()[0], flush=True)
"""

PROBES = [
    ("cpu-only", PRELUDE.format(cuda=False) + CPU_ONLY),
    ("no-throw", PRELUDE.format(cuda=True) + CASE.format(name="bias_gelu_forward", good=True, key=None)),
    ("torch-control", PRELUDE.format(cuda=True) + TORCH_CONTROL),
] + [(f"{kind}: {key[0]} {key[1]!r}", PRELUDE.format(cuda=True) + CASE.format(name=None, good=False, key=key))
     for kind, key in [
         ("no-number", ("bias_gelu_forward", "x on the CPU")),
         ("no-number", ("bias_gelu_forward", "x float64")),
         ("no-number", ("bias_gelu_forward", "bias fp32")),
         ("integer", ("bias_gelu_forward", "bias on the CPU")),  # "cuda:0": the device index
         ("integer", ("bias_gelu_forward", "bias 2-D")),  # today's first crash
         ("integer", ("softmax_forward", "mask sq wrong")),  # the crash of 2026-11-26's first run
         ("double", ("softmax_backward", "scale inf")),
     ]]

NO_GPU = r"""
import torch
import megatron_fused_kernels as ext
from tests.kernel_binding_cases import BAD


class LooksCuda(torch.Tensor):
    # a meta tensor's sizes, strides and dtype on device cuda:0 with no storage: every argument check runs as
    # on a GPU; whatever passes them (an allocation, a pointer) dispatches here and raises
    @staticmethod
    def __new__(cls, meta):
        return torch.Tensor._make_wrapper_subclass(cls, meta.shape, strides=meta.stride(), dtype=meta.dtype,
                                                   device="cuda:0", storage_offset=meta.storage_offset())

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"passed the checks: {func}")


counts = {}
for key, case in sorted(BAD.items()):
    print("START", key, flush=True)
    try:
        name, args = case("meta")
        getattr(ext, name)(*(LooksCuda(a) if isinstance(a, torch.Tensor) and a.is_meta else a for a in args))
        result = "ok"
    except Exception as e:
        result = type(e).__name__ + ": " + str(e).splitlines()[0]
    counts[result.split(":")[0]] = counts.get(result.split(":")[0], 0) + 1
    print("RESULT", key, result, flush=True)
print("COUNTS", counts, flush=True)
"""

OWN = ("megatron_fused_kernels", "libstdc++", "libc.so", "libm.so", "libgcc_s", "libpython", "/torch/lib/",
       "ld-linux")


def run(code, env=None, timeout=120):
    full_env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "timed out"
    return proc.returncode, proc.stdout, proc.stderr


def under_gdb(code):
    if not shutil.which("gdb"):
        return "gdb not installed"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = ["gdb", "-q", "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 40",
           "-ex", "info registers rip", "-ex", "x/6i $pc", "--args", sys.executable, "-c", code]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "gdb timed out"
    lines = proc.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if "SIGSEGV" in line or "signal" in line.lower()), 0)
    return "\n".join(lines[start:start + 70])


def foreign_bindings(code):
    """[(library, symbol)] the module binds outside its expected providers (LD_DEBUG=bindings)."""
    with tempfile.TemporaryDirectory() as tmp:
        run(code, env={"LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": os.path.join(tmp, "ld")})
        found = set()
        for path in glob.glob(os.path.join(tmp, "ld*")):
            with open(path, errors="replace") as f:
                for line in f:
                    if "binding file" not in line or "megatron_fused_kernels" not in line.split(" to ")[0]:
                        continue
                    target = line.split(" to ", 1)[1].split(" [", 1)[0]
                    if not any(own in target for own in OWN):
                        found.add((target, line.rsplit("`", 1)[-1].split("'")[0]))
    demangle = shutil.which("c++filt")
    out = []
    for lib, sym in sorted(found):
        if demangle:
            sym = subprocess.run([demangle, sym], capture_output=True, text=True).stdout.strip()
        out.append(f"{os.path.basename(lib)}: {sym}")
    return out


def toolchain():
    lines = [f"python {sys.version.split()[0]}"]
    import torch
    lines.append(f"torch {torch.__version__} cuda {torch.version.cuda}")
    for tool in ("c++", "nvcc"):
        if shutil.which(tool):
            version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
            lines.append(f"{tool}: {version[0] if tool == 'c++' else version[-1]}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--no-gpu", action="store_true", help="run every bad case's checks without a GPU")
    args = parser.parse_args()
    if args.no_gpu:
        rc, out, err = run("import faulthandler; faulthandler.enable()\n" + NO_GPU, timeout=600)
        print(out + err[-6000:] + f"exit {rc}")
        sys.exit(0 if rc == 0 else 1)
    report = toolchain()
    died = []
    for name, code in PROBES:
        rc, out, err = run(code)
        result = next((line[7:] for line in out.splitlines() if line.startswith("RESULT ")), None)
        status = "timeout" if rc is None else f"exit {rc}"
        report.append(f"{name:58s} {status:8s} {result or '(no result: died)'}")
        if rc != 0:
            died.append((name, code, rc, err))
    report.append("\nsymbols the module binds to another library (LD_DEBUG=bindings):")
    import torch
    # the module as the GPU tests load it (after CUDA is initialised), or plainly without a GPU
    report += ["  " + line for line in foreign_bindings(PROBES[1 if torch.cuda.is_available() else 0][1])] or ["  none"]
    for name, code, rc, err in died:
        report += [f"\n===== {name}: stderr (faulthandler, torch's C++ frames)", err[-20000:]]
        if rc is not None and rc < 0:  # killed by a signal: the native frames under gdb too
            report += [f"===== {name}: gdb", under_gdb(code)]
    text = "\n".join(report)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
