"""utils/compile_ahead.py: inside the block a Triton launch only compiles (in a thread pool),
other threads launch as usual, and afterwards the kernel runs from Triton's cache."""
import threading

import pytest
import torch

from nanovllm.utils import compile_ahead as ca


def test_off_switch(monkeypatch):
    monkeypatch.setenv("NANOVLLM_COMPILE_AHEAD", "0")
    assert not ca.enabled()
    with ca.compile_ahead() as ahead:
        assert ahead is False


@pytest.mark.gpu
def test_gpu_launch_compiles_only_then_runs_from_cache():
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    launch = JITFunction.run
    x = torch.zeros(100, device="cuda")
    y = torch.zeros(100, device="cuda")
    with ca.compile_ahead() as ahead:
        assert ahead
        add_one[(1,)](x, 100, BLOCK=128)  # compile-only: x stays zero
        other = threading.Thread(target=lambda: add_one[(1,)](y, 100, BLOCK=128))
        other.start()
        other.join()  # another thread's launch runs for real
    torch.cuda.synchronize()
    assert JITFunction.run is launch  # Triton's own launcher is back
    assert (x == 0).all() and (y == 1).all()
    cache = add_one.device_caches[torch.cuda.current_device()][0]
    assert len(cache) == 1  # compiled once, finalized (not a pending future)
    assert not hasattr(next(iter(cache.values())), "future")
    add_one[(1,)](x, 100, BLOCK=128)
    torch.cuda.synchronize()
    assert (x == 1).all()
