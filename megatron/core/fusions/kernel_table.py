"""Which implementation a fused op runs on this GPU, decided from GPU measurements on file.

A kernel is a default only where a measurement of it on this GPU model shows it faster than
both eager torch and torch.compile of the same op (ARCHITECTURE.md, invariant 5). The figures
live in one committed table, kernel_table.json beside this file, written by
`bench/kernels.py --write-table` (device name -> op -> fused_ms, eager_ms, compiled_ms and the
implementation to run by default); MEGATRON_KERNEL_TABLE=path points the fronts at another
table (the GPU suite uses it to pick from figures it has just measured). choose() is the one
place that decides; without an entry for this GPU the answer is eager torch, and a flag still
forces a choice (--no-*-fusion: torch; --fused-kernels csrc: our kernel wherever it runs).
"""
import dataclasses
import functools
import json
import math
import os

OPS = ("masked softmax", "causal softmax", "layernorm", "rmsnorm", "bias-gelu", "bias-swiglu", "rope")
IMPLS = ("csrc", "apex", "compiled", "torch")
FIELDS = ("fused_ms", "eager_ms", "compiled_ms")
DEFAULT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_table.json")
ENV = "MEGATRON_KERNEL_TABLE"


class KernelTableError(ValueError):
    """The table named by MEGATRON_KERNEL_TABLE (or the committed one) cannot be used."""


@dataclasses.dataclass(frozen=True)
class KernelFlags:
    """What the configuration says about one op: enabled=False is its --no-*-fusion flag (named
    in `flag`, for the reason); force is --fused-kernels (auto: the table decides)."""
    enabled: bool = True
    force: str = "auto"
    flag: str = ""


def default_impl(fused_ms, eager_ms, compiled_ms):
    """The implementation a measurement makes the default: our kernel only where it beat both eager
    torch and torch.compile; otherwise the faster of those two (eager on a tie: nothing to compile)."""
    if fused_ms < min(eager_ms, compiled_ms):
        return "csrc"
    return "compiled" if compiled_ms < eager_ms else "torch"


def table_path():
    return os.environ.get(ENV) or DEFAULT_PATH


def _check_entry(where, entry):
    if not isinstance(entry, dict):
        raise KernelTableError(f"{where}: expected an object with {', '.join(FIELDS)} and default")
    for field in FIELDS:
        value = entry.get(field)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise KernelTableError(f"{where}.{field}: expected a positive number of ms, got {value!r}")
    if entry.get("default") not in IMPLS:
        raise KernelTableError(f"{where}.default: expected one of {', '.join(IMPLS)}, got {entry.get('default')!r}")


@functools.lru_cache(maxsize=8)
def load(path):
    """{device name: {op: entry}} from `path`; KernelTableError naming the problem when it is
    unreadable or malformed. A missing committed table is an empty one (nothing measured)."""
    if not os.path.exists(path):
        if path == DEFAULT_PATH:
            return {}
        raise KernelTableError(f"kernel table {path} ({ENV}) does not exist")
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError) as e:
        raise KernelTableError(f"kernel table {path} cannot be read: {e}") from None
    if not isinstance(table, dict):
        raise KernelTableError(f"kernel table {path}: expected an object of device names")
    for device, ops in table.items():
        if not isinstance(ops, dict):
            raise KernelTableError(f"kernel table {path}: {device!r} must map op names to entries")
        for op, entry in ops.items():
            if op.startswith("_"):  # _meta: where the figures come from
                continue
            if op not in OPS:
                raise KernelTableError(f"kernel table {path}: {device!r} has unknown op {op!r} (ops: {', '.join(OPS)})")
            _check_entry(f"kernel table {path}: {device!r}.{op!r}", entry)
    return table


def _figures(entry, device_name, source):
    fused, eager, compiled = (entry[f] for f in FIELDS)
    where = f"on {device_name}, {source}"
    if entry["default"] == "csrc":
        return f"csrc {fused / eager:.2f}x eager, {fused / compiled:.2f}x torch.compile {where}"
    if entry["default"] == "compiled":
        return (f"torch.compile {compiled / eager:.2f}x eager, {compiled / fused:.2f}x csrc {where}")
    bases = ((eager, "eager"), (compiled, "torch.compile"))
    losses = [f"{fused / base:.2f}x slower than {name}" for base, name in bases if fused >= base]
    if losses:
        return f"csrc {' and '.join(losses)} {where}"
    return f"{entry['default']} chosen in the table {where}"


def choose(op, device_name, flags, unavailable=None, table=None, source=None):
    """(impl, reason) for `op` on the GPU named `device_name` (None: not a CUDA device).

    unavailable: {impl: why} for the implementations that cannot run here (csrc not built, apex
    not installed, ...); torch always can. table: {device: {op: entry}} (default: load(table_path()));
    source: how the reason names the table (default: its file name).
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r} (ops: {', '.join(OPS)})")
    unavailable = unavailable or {}
    if not flags.enabled:
        return "torch", flags.flag or "fusion off"
    if flags.force != "auto":
        if flags.force in unavailable:
            why = unavailable[flags.force]
            return "torch", f"--fused-kernels {flags.force}, but {flags.force} is unavailable: {why}"
        return flags.force, f"--fused-kernels {flags.force}"
    if device_name is None:
        return "torch", unavailable.get("csrc", "not a CUDA device")
    if table is None:
        path = table_path()
        table, source = load(path), source or os.path.basename(path)
    source = source or "kernel table"
    entry = table.get(device_name, {}).get(op)
    if entry is None:
        return "torch", f"no GPU result on file for {device_name}, {source}"
    impl = entry["default"]
    if impl in unavailable:
        return "torch", f"{impl} is the default on {device_name} ({source}) but unavailable: {unavailable[impl]}"
    return impl, _figures(entry, device_name, source)
