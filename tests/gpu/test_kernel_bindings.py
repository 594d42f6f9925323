"""Every binding of the CUDA build raises a Python exception on every bad input
(tests/kernel_binding_cases.py, the cases the CPU test build runs in
tests/unit/test_kernel_bindings.py), and runs its valid call.

The cases run in a subprocess that prints each case's name before calling it: a crash
(segmentation fault, abort) then fails this test with the case that caused it, instead of
killing pytest (on 2026-11-26 softmax_forward with a mask of the wrong shape crashed the run).
"""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# faulthandler and torch's fatal-signal handler: a crash prints its Python and native (C++) frames on
# stderr, which the failure message carries (tests/gpu/bindings_crash_probe.py separates the causes)
CHILD = r"""
import faulthandler, json, torch
faulthandler.enable()
torch._C._set_print_stack_traces_on_fatal_signal(True)
from megatron.core.fusions import _ext
from tests.kernel_binding_cases import BAD, GOOD, run_case
ext = _ext.load()
assert ext is not None, _ext.status()
cases = [(["good", k], v) for k, v in sorted(GOOD.items())] + [(list(k), v) for k, v in sorted(BAD.items())]
for name, case in cases:
    print("START " + json.dumps(name), flush=True)
    try:
        run_case(ext, case, "cuda")
        torch.cuda.synchronize()
        result = "ok"
    except Exception as e:
        result = type(e).__name__ + ": " + str(e).splitlines()[0]
    print("RESULT " + json.dumps([name, result]), flush=True)
"""


def test_every_binding_raises_on_every_bad_input():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1500)
    started, results = None, {}
    for line in proc.stdout.splitlines():
        if line.startswith("START "):
            started = json.loads(line[6:])
        elif line.startswith("RESULT "):
            name, result = json.loads(line[7:])
            results[tuple(name)] = result
    assert proc.returncode == 0, (f"the bindings' process died (exit {proc.returncode}) in case {started}:\n"
                                  f"{proc.stderr[-12000:]}")
    from tests.kernel_binding_cases import BAD, GOOD
    bad = {case: results.get(case) for case in BAD}
    assert all(r is not None and r.split(":")[0] in ("ValueError", "TypeError") for r in bad.values()), \
        {case: r for case, r in bad.items() if r is None or r.split(":")[0] not in ("ValueError", "TypeError")}
    good = {name: results.get(("good", name)) for name in GOOD}
    assert all(r == "ok" for r in good.values()), good
