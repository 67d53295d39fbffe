"""Child processes, the one way nanovllm makes them (engine cores, data-parallel replicas,
tensor-parallel workers): start, pipes, death watch, stop. No torch here.

How children start: NANOVLLM_WORKER_MULTIPROC_METHOD=spawn (the default: a fresh interpreter
each, importing torch anew, 1-2 s of CPU) or forkserver (forked from one server process that
imported torch once, at the first child; the test suite uses it). Both are safe with CUDA: the
fork server is itself a fresh interpreter (fork + exec), so it holds none of its parent's CUDA
state, and it only imports modules (FORKSERVER_PRELOAD), which does not initialize CUDA; each
child forked from it initializes CUDA for itself, as a spawned one does. A forked child gets
the parent's current environment (set first thing), but torch was imported with the
environment of the moment the server started: variables read at torch's import
(OMP_NUM_THREADS, ...) take that value.

A spawned child re-imports the user's script before running anything of ours. Without an
`if __name__ == "__main__":` guard, that import creates the engine again, inside the child;
multiprocessing then refuses to start a grandchild with a long generic message, and the parent
only sees a child that exited while starting. Both sides here name the guard instead.
"""
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from multiprocessing import connection
from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)

START_METHOD_VAR = "NANOVLLM_WORKER_MULTIPROC_METHOD"
START_METHODS = ("spawn", "forkserver")
# Imported once by the fork server, so its children start with them. Only installed packages:
# the server may start with the default sys.path (Python 3.11's does), where a nanovllm
# checkout added to sys.path at run time is not found, or another copy is.
FORKSERVER_PRELOAD = ["torch", "transformers.configuration_utils"]
GUARD_HINT = ('if this runs from a script, put the code that creates the engine under '
              '`if __name__ == "__main__":` (nanovllm starts spawned processes, and each one '
              're-imports the script; see examples/tensor_parallel.py)')
# How long stop() waits for a child to exit by itself before terminating it.
STOP_TIMEOUT_S = 30.0
# After terminate(): how long before kill().
TERMINATE_TIMEOUT_S = 2.0
# How long to wait for the status another thread reaped to land in the Process object.
REAP_TIMEOUT_S = 1.0


def start_method() -> str:
    """How child processes start: $NANOVLLM_WORKER_MULTIPROC_METHOD, spawn by default."""
    method = os.environ.get(START_METHOD_VAR, "spawn")
    if method not in START_METHODS:
        raise ValueError(f"{START_METHOD_VAR}={method!r} is not a start method nanovllm "
                         f"supports; use one of {', '.join(START_METHODS)}")
    return method


def start_context(what: str):
    """multiprocessing's context for start_method() (never plain fork: CUDA cannot be forked
    into a child); RuntimeError naming the guard when called while a child is still importing
    the main script (the engine created at top level)."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(f"{what} was created while a spawned nanovllm process was importing "
                           f"the main script; {GUARD_HINT}")
    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect once the server runs
    return ctx


def exit_description(code: int | None) -> str:
    """How a process ended, from its exit code (None: unknown, e.g. reaped elsewhere)."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def pipes(ctx) -> tuple[tuple[Connection, Connection], tuple[Connection, Connection]]:
    """((send, receive) for this side, (receive, send) for the child): two one-way pipes."""
    to_child_recv, to_child_send = ctx.Pipe(duplex=False)
    from_child_recv, from_child_send = ctx.Pipe(duplex=False)
    return (to_child_send, from_child_recv), (to_child_recv, from_child_send)


def reaped_exitcode(p) -> int | None:
    """p.exitcode, also when another thread's join() reaped p first: our waitpid then got
    ECHILD and reads None, while that thread stores the status in the same Process object a
    moment later (two threads joining one child: a reader thread and its caller)."""
    code = p.exitcode
    if code is None and connection.wait([p.sentinel], timeout=0):
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while p.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        code = p.exitcode
    return code


class Child:
    """One child process: started at once, watched, and stopped (asked, then terminated,
    then killed). Its status is read by one thread at a time: a fork server's child reports
    it through a pipe that only one reader can drain (a second would read 255)."""

    def __init__(self, ctx, target, args: tuple, name: str, group: bool = False):
        """group: the child makes a process group of its own (start_group), which stop()
        kills if the child did not exit cleanly."""
        self.group = group
        self._lock = threading.Lock()
        if ctx.get_start_method() == "forkserver":  # as spawned: the environment of now
            target, args = _in_environment, (dict(os.environ), target, args)
        self.proc = ctx.Process(target=target, name=name, args=args)
        self.proc.start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    @property
    def sentinel(self) -> int:
        """Ready once the process has ended (for multiprocessing.connection.wait)."""
        return self.proc.sentinel

    def is_alive(self) -> bool:
        """Whether the process still runs."""
        return not self._ended(0)

    def _ended(self, timeout_s: float | None) -> bool:
        """Wait up to timeout_s (None: for ever) for the process to end."""
        ready = bool(connection.wait([self.proc.sentinel], timeout=timeout_s))
        # A fork server's sentinel is readable while the status waits in it, and again once
        # the server closes it: in between, a status just read is the sign.
        with self._lock:
            return ready or self.proc.exitcode is not None

    def exitcode(self, wait_s: float = 0.0) -> int | None:
        """The exit code, after waiting up to wait_s for the process to end (its pipes close
        a moment before its status is readable); None while it runs."""
        if not self._ended(wait_s):
            return None
        with self._lock:
            self.proc.join(REAP_TIMEOUT_S)
            return reaped_exitcode(self.proc)

    def join(self, timeout_s: float | None = None) -> None:
        """Wait up to timeout_s (None: for ever) for the process to end."""
        self.exitcode(timeout_s)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait up to timeout_s for the process to exit (it was asked to), then terminate it,
        then kill it (and its process group, if it made one and did not exit cleanly)."""
        p = self.proc
        if not self._ended(timeout_s):
            if timeout_s:
                logger.warning("%s did not stop in %.0f s: terminating it", p.name, timeout_s)
            p.terminate()
            if not self._ended(TERMINATE_TIMEOUT_S):
                p.kill()
        code = self.exitcode(wait_s=None)
        if self.group and code != 0:
            # Killed: its own children (tensor-parallel workers) would notice only later.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # none left


def _in_environment(environment: dict, target, args: tuple):
    """A forked child's entry: the parent's environment of the start, then target(*args)."""
    os.environ.clear()
    os.environ.update(environment)
    return target(*args)


def start_group() -> None:
    """Make the calling child a process group of its own, which its children join: if it is
    killed, its parent stops them at once (Child.stop(kill_group=True))."""
    os.setpgid(0, 0)


def exit_at_once() -> None:
    """End this child now, without the interpreter's teardown (~0.4 s with torch loaded, while
    the parent waits in its shutdown): multiprocessing's exit work first, as a child's normal
    exit does it (its finalizers release the semaphores and segments this process made), then
    the logs and stdio flushed."""
    from multiprocessing import util

    util._exit_function()  # what multiprocessing runs when a child's target returns
    stop_helpers()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def stop_helpers() -> None:
    """Stop the fork server and the resource tracker this process started, and wait for them.
    Left alone they exit once they see this process's end (their pipe closes), a moment after
    it: a process group then outlives its leader (seen: a core process's fork server still
    running 2 s after a clean shutdown, on a loaded 2-core machine). multiprocessing offers no
    public call for this; where its private ones are missing, the helpers exit as before."""
    from multiprocessing import forkserver, resource_tracker

    for helper, pid in ((getattr(forkserver, "_forkserver", None), "_forkserver_pid"),
                        (getattr(resource_tracker, "_resource_tracker", None), "_pid")):
        # A helper inherited from the parent (pid None here) serves other processes too.
        if getattr(helper, pid, None) is None or not hasattr(helper, "_stop"):
            continue
        try:
            helper._stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("stopping %r failed", helper, exc_info=True)
