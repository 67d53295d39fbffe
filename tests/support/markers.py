"""Markers of the kernel tests: CPU tests run Triton's interpreter on CPU tensors
(TRITON_INTERPRET=1, set by tests/conftest.py without CUDA); `gpu` ones the compiled kernels."""
import os

import pytest
import torch

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="needs TRITON_INTERPRET=1 (CPU)")


def on_gpu(test):
    """The `gpu` marker, with a skip where no CUDA GPU is visible."""
    no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    return pytest.mark.gpu(no_cuda(test))
