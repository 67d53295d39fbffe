"""The tree stays lint-clean: pyflakes' checks (undefined names, unused imports: ruff's F)
and the 100-column limit (E501) over every Python file of the repository."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    """`ruff check --select E501,F` passes (ruff comes with the test extra)."""
    pytest.importorskip("ruff")
    from ruff.__main__ import find_ruff_bin

    r = subprocess.run([find_ruff_bin(), "check", "--select", "E501,F", "--output-format",
                        "concise", "--no-cache", str(ROOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
