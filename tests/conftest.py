"""Shared fixtures. Triton runs in interpreter mode when no GPU is present."""
import os

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # the control-plane tests need no torch
    _HAS_CUDA = False
if not _HAS_CUDA:
    # Must be set before any @triton.jit kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip)
