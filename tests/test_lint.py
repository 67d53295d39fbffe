"""The tree stays lint-clean: pyflakes' checks (undefined names, unused imports: ruff's F)
and the 100-column limit (E501) over every Python file of the repository; docstrings on the
package's public surfaces."""
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


def test_public_surfaces_have_docstrings():
    """Every public class, function and method of the package and the examples has a
    docstring (ruff's D101-D103; tests and tools/ scripts are not held to it)."""
    pytest.importorskip("ruff")
    from ruff.__main__ import find_ruff_bin

    paths = [str(ROOT / p) for p in ("nanovllm", "examples", "example.py")]
    r = subprocess.run([find_ruff_bin(), "check", "--select", "D101,D102,D103",
                        "--output-format", "concise", "--no-cache", *paths],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
