"""Every id in tests/full_matrix.py names a test the suite collects (a renamed case would otherwise be
neither skipped nor noticed), and the default run skips exactly those."""
import os
import subprocess
import sys

from tests.full_matrix import FULL_ONLY

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_full_matrix_id_is_collected_and_skipped_by_default():
    files = sorted({i.split("::")[0] for i in FULL_ONLY})
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_TEST_FULL"}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300).stdout
    collected = {line.strip() for line in out.splitlines() if "::" in line}
    assert collected >= FULL_ONLY, sorted(FULL_ONLY - collected)
    assert len(collected - FULL_ONLY) >= len(files)  # each file keeps cases in the default run
