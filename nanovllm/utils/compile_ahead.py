"""Compile the Triton kernels a warm-up pass will launch on many threads at once, before it
launches them.

A fresh machine's start-up is mostly Triton compiling one kernel variant after another as the
warm-up reaches it (~0.3-1 s each, single-threaded). Inside `compile_ahead()`, a launch only
submits its kernel's compile to a thread pool (Triton's AsyncCompileMode) and returns without
running; leaving the block waits for every compile, so the same pass run again finds them all
in Triton's cache. Compiling mostly releases the GIL (LLVM, ptxas), so the threads overlap:
on a 2-core CPU machine, four GEMM variants compiled for sm_90 took 2.7 s on two threads
against 4.5 s on one.

The pass inside the block computes nothing: a skipped kernel leaves its outputs as they were,
so it must be one whose correctness never depends on a kernel's results (the warm-up passes:
fixed inputs, outputs discarded). NANOVLLM_COMPILE_AHEAD=0 turns it off.

Two more pieces of a fresh start leave the main thread (H100 host, 2026-11-25: ~5 s of it).
Each compile thread also builds its kernel's launcher, a C module Triton otherwise compiles
with gcc at the kernel's first real launch (~0.3 s each, one after another). prewarm() starts
what the first compile would do first: hashing Triton's own sources and library into its cache
key (~2 s) and building its driver's C helpers.
"""
import contextlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)


def enabled() -> bool:
    """Whether compile_ahead() compiles ahead (needs Triton's AsyncCompileMode, Triton >= 3.4)."""
    if os.environ.get("NANOVLLM_COMPILE_AHEAD", "1") == "0":
        return False
    try:
        from triton.runtime._async_compile import AsyncCompileMode  # noqa: F401
    except ImportError:
        return False
    return True


_prewarm: threading.Thread | None = None


def prewarm() -> None:
    """Start Triton's one-time set-up (its cache key, its driver's helpers) on a thread, so it
    overlaps the model build; compile_ahead() waits for it. A no-op when not enabled()."""
    global _prewarm
    if _prewarm is not None or not enabled():
        return

    def work():
        try:
            from triton.runtime import driver
            from triton.runtime.cache import triton_key

            triton_key()  # lru-cached: every later compile's key reuses it
            driver.active.utils  # noqa: B018 (built on first use)
        except Exception as e:  # the first compile does it then
            logger.debug("prewarming Triton failed: %r", e)

    _prewarm = threading.Thread(target=work, name="nanovllm-triton-prewarm", daemon=True)
    _prewarm.start()


def _compile_and_link(compile_fn):
    """A compile of the pool, then its launcher (cached on disk, so the first real launch
    only loads it)."""
    kernel = compile_fn()
    try:
        from triton.runtime import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception as e:  # the first real launch builds it, as without this
        logger.debug("building a launcher ahead failed: %r", e)
    return kernel


class _LaunchersToo:
    """The pool as AsyncCompileMode sees it (it only calls submit)."""

    def __init__(self, pool: ThreadPoolExecutor):
        self._pool = pool

    def submit(self, compile_fn):
        """Submit a compile that also builds its kernel's launcher."""
        return self._pool.submit(_compile_and_link, compile_fn)


_local = threading.local()  # .on: this thread is inside compile_ahead()
_lock = threading.Lock()
_users = 0
_launch = None  # JITFunction.run as Triton defines it (kept: a late call may still come here)


def _run(self, *args, grid, warmup, **kwargs):
    """JITFunction.run while some thread compiles ahead: compile-only in that thread."""
    return _launch(self, *args, grid=grid, warmup=warmup or getattr(_local, "on", False),
                   **kwargs)


def active() -> bool:
    """Whether this thread is inside compile_ahead(), where Triton launches do not run."""
    return getattr(_local, "on", False)


@contextlib.contextmanager
def compile_ahead(workers: int | None = None):
    """Inside (this thread only): Triton launches start their compiles on `workers` threads
    and do not run. On exit every compile has finished. A no-op block when not enabled()."""
    global _users, _launch
    if not enabled() or getattr(_local, "on", False):
        yield False
        return
    from triton.runtime._async_compile import AsyncCompileMode
    from triton.runtime.jit import JITFunction

    workers = workers or min(16, os.cpu_count() or 1)
    if _prewarm is not None:
        _prewarm.join()
    with _lock:
        if _users == 0:
            _launch, JITFunction.run = JITFunction.run, _run
        _users += 1
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="nanovllm-compile") as pool, \
                AsyncCompileMode(_LaunchersToo(pool)):
            _local.on = True
            try:
                yield True
            finally:
                _local.on = False
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                JITFunction.run = _launch
