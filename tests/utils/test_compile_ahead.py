"""utils/compile_ahead.py: inside the block a Triton launch only compiles (in a thread pool),
other threads launch as usual, and afterwards the kernel runs from Triton's cache."""
import threading
from types import SimpleNamespace

import pytest
import torch

from nanovllm.utils import compile_ahead as ca


def test_off_switch(monkeypatch):
    monkeypatch.setenv("NANOVLLM_COMPILE_AHEAD", "0")
    assert not ca.enabled()
    with ca.compile_ahead() as ahead:
        assert ahead is False
    monkeypatch.setattr(ca, "_prewarm", None)
    ca.prewarm()  # nothing to overlap: no thread
    assert ca._prewarm is None


def test_a_compile_thread_builds_the_kernels_launcher(monkeypatch):
    import triton.runtime

    built = []

    class Active:
        @staticmethod
        def launcher_cls(src, metadata):
            built.append((src, metadata))

    kernel = SimpleNamespace(src="source", metadata="metadata")
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=Active))
    assert ca._compile_and_link(lambda: kernel) is kernel
    assert built == [("source", "metadata")]
    # A driver that cannot build it leaves the kernel as compiled: its first launch builds it.
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=None))
    assert ca._compile_and_link(lambda: kernel) is kernel


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


@pytest.mark.gpu
def test_gpu_compile_threads_build_the_launchers(monkeypatch, tmp_path):
    """A fresh start's launchers (C modules Triton builds with gcc) are built by the compile
    threads, not by the first real launch on the calling thread."""
    import triton
    import triton.language as tl
    import triton.runtime.build as build

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # nothing built before
    builds = []
    real_build = build._build

    def counting_build(*args, **kwargs):
        builds.append(threading.current_thread().name)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(build, "_build", counting_build)

    @triton.jit
    def scale_rows(x_ptr, s, n, stride, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        row = tl.program_id(0) * stride
        tl.store(x_ptr + row + offs, tl.load(x_ptr + row + offs, mask=offs < n) * s,
                 mask=offs < n)

    x = torch.ones(3, 40, device="cuda")
    with ca.compile_ahead() as ahead:
        assert ahead
        scale_rows[(3,)](x, 2.0, 40, 40, BLOCK=64)
    assert builds and all(name.startswith("nanovllm-compile") for name in builds)
    before = len(builds)
    scale_rows[(3,)](x, 2.0, 40, 40, BLOCK=64)
    torch.cuda.synchronize()
    assert len(builds) == before  # the first real launch loaded the built launcher
    assert (x == 2).all()
