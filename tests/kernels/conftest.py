"""Kernel-test fixtures. The case builders are plain functions in tests/support/paged.py."""
import pytest
import torch


@pytest.fixture
def poisoned_empty(monkeypatch):
    """Every float tensor from torch.empty/empty_like starts as NaN, so an output element a kernel
    never writes fails the test. Requested by the tests that check a kernel writes all of its
    output (`@pytest.mark.usefixtures("poisoned_empty")`)."""
    orig_empty, orig_empty_like = torch.empty, torch.empty_like

    def poisoned(fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            if out.is_floating_point():
                out.fill_(float("nan"))
            return out
        return wrapper

    monkeypatch.setattr(torch, "empty", poisoned(orig_empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(orig_empty_like))
