"""torch.compile for small fused ops, on GPU only (compiling on CPU costs ~25 s and gains little)."""
import functools

import torch


def compile_on_cuda(fn):
    """Run fn through torch.compile when its first tensor argument lives on a GPU."""
    compiled = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal compiled
        x = next(a for a in args if isinstance(a, torch.Tensor))
        if not x.is_cuda:
            return fn(*args, **kwargs)
        if compiled is None:
            # Made on the first GPU call: torch.compile imports its compiler (seconds), which a
            # CPU run never needs.
            compiled = torch.compile(fn, dynamic=True)
        return compiled(*args, **kwargs)

    return wrapper
