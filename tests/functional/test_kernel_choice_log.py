"""The start-up log says which implementation each fused op runs and why, one line per op; a
kernel table named by MEGATRON_KERNEL_TABLE that cannot be used is one `error:` line (exit 2)."""
from .cli import run_cli
from .test_bad_inputs import MOCK, assert_one_error_line


def test_log_names_each_choice_and_its_reason(tmp_path):
    table = tmp_path / "table.json"
    table.write_text('{"NVIDIA H200": {"layernorm": {"fused_ms": 1, "eager_ms": 2, "compiled_ms": 3, '
                     '"default": "csrc"}}}')
    proc = run_cli(MOCK + ["--no-bias-gelu-fusion"], env={"MEGATRON_KERNEL_TABLE": str(table)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("> kernel choice:")]
    assert lines == ["> kernel choice: LayerNorm=torch (not a CUDA device)",
                     "> kernel choice: bias-gelu=torch (--no-bias-gelu-fusion)"], proc.stdout[-3000:]


def test_unusable_kernel_table_is_one_error_line(tmp_path):
    table = tmp_path / "table.json"
    table.write_text('{"NVIDIA H200": {"layernorm": {"fused_ms": -1, "eager_ms": 2, "compiled_ms": 3, '
                     '"default": "csrc"}}}')
    proc = run_cli(MOCK, check=False, env={"MEGATRON_KERNEL_TABLE": str(table)})
    assert_one_error_line(proc, "fused_ms")
    proc = run_cli(MOCK, check=False, env={"MEGATRON_KERNEL_TABLE": str(tmp_path / "missing.json")})
    assert_one_error_line(proc, "MEGATRON_KERNEL_TABLE")
