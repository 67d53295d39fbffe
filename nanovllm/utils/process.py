"""Child processes, the one way nanovllm makes them (engine cores, data-parallel replicas,
tensor-parallel workers): spawn, pipes, death watch, stop. No torch here.

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
import time
from multiprocessing import connection
from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)

GUARD_HINT = ('if this runs from a script, put the code that creates the engine under '
              '`if __name__ == "__main__":` (nanovllm starts spawned processes, and each one '
              're-imports the script; see examples/tensor_parallel.py)')
# How long stop() waits for a child to exit by itself before terminating it.
STOP_TIMEOUT_S = 30.0
# After terminate(): how long before kill().
TERMINATE_TIMEOUT_S = 2.0
# How long to wait for the status another thread reaped to land in the Process object.
REAP_TIMEOUT_S = 1.0


def spawn_context(what: str):
    """multiprocessing's spawn context; RuntimeError naming the guard when called while a
    spawned child is still importing the main script (the engine created at top level)."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(f"{what} was created while a spawned nanovllm process was importing "
                           f"the main script; {GUARD_HINT}")
    return mp.get_context("spawn")  # CUDA cannot be forked into a child


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
    """One spawned process: started at once, watched, and stopped (asked, then terminated,
    then killed)."""

    def __init__(self, ctx, target, args: tuple, name: str, group: bool = False):
        """group: the child makes a process group of its own (start_group), which stop()
        kills if the child did not exit cleanly."""
        self.group = group
        self.proc = ctx.Process(target=target, name=name, args=args)
        self.proc.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def sentinel(self) -> int:
        """Ready once the process has ended (for multiprocessing.connection.wait)."""
        return self.proc.sentinel

    def is_alive(self) -> bool:
        return self.proc.is_alive()

    def exitcode(self, wait_s: float = 0.0) -> int | None:
        """The exit code, after waiting up to wait_s for the process to end (its pipes close
        a moment before its status is readable); None while it runs."""
        if wait_s:
            self.proc.join(wait_s)
        return reaped_exitcode(self.proc)

    def join(self, timeout_s: float | None = None) -> None:
        self.proc.join(timeout_s)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait up to timeout_s for the process to exit (it was asked to), then terminate it,
        then kill it (and its process group, if it made one and did not exit cleanly)."""
        p = self.proc
        p.join(timeout_s)
        if p.is_alive():
            if timeout_s:
                logger.warning("%s did not stop in %.0f s: terminating it", p.name, timeout_s)
            p.terminate()
            p.join(TERMINATE_TIMEOUT_S)
        if p.is_alive():
            p.kill()
            p.join()
        if self.group and p.exitcode != 0:
            # Killed: its own children (tensor-parallel workers) would notice only later.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # none left


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
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
