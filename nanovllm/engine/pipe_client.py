"""PipeClient: an engine core behind two pipes, in a child process or on a thread of this
one, with one reader thread and one death path. No torch here."""
import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable

from nanovllm.engine.client import ClientState, EngineDeadError, Sink
from nanovllm.engine.core import EngineCore
from nanovllm.engine.messages import (Abort, AddRequests, Dead, Outputs, Ready, Request, Stats,
                                      StatsQuery, Stop, Tokenizer)
from nanovllm.utils.process import GUARD_HINT, exit_description

logger = logging.getLogger(__name__)


class ThreadRunner:
    """A core served on a thread of this process: a runner as a Child is, without a pid."""

    pid = None

    def __init__(self, target, args: tuple, name: str):
        self.thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.thread.start()

    def is_alive(self) -> bool:
        """Whether the serving thread still runs."""
        return self.thread.is_alive()

    def exitcode(self, wait_s: float = 0.0) -> None:
        """None: a thread has no exit code (Child's returns the process's)."""
        return None

    def stop(self, timeout_s: float | None = None) -> None:
        """Wait up to timeout_s for the thread to end (not from the thread itself)."""
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)


class PipeClient:
    """A core behind two pipes, run by `runner` (a utils.process.Child, or a ThreadRunner):
    commands go down one pipe, and one reader thread hands the core's outputs to sink."""

    def __init__(self, name: str, runner, conns: tuple, sink: Sink):
        """name: how errors call the core ("data-parallel replica 1"); conns: this side's
        (send, receive) ends."""
        self.name, self.runner, self.sink = name, runner, sink
        self.core: EngineCore | None = None  # the core, when it runs on a thread of ours
        self._inbox, self._outbox = conns
        self.state = ClientState.STARTING
        self.error: BaseException | None = None  # why the core stopped, once it has
        self.num_kvcache_blocks = 0
        self.pending: dict[int, int] = {}  # request id -> its cost (front end's balancing)
        self._stats: dict[int, concurrent.futures.Future] = {}
        self._tokens = itertools.count()
        # The state check and a send share the lock: nothing is sent (or registered by the
        # caller) after the reader has declared the core dead.
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def wait_ready(self) -> None:
        """Block until the core is built; raise what stopped it if it failed to start."""
        try:
            msg = self._outbox.recv()
        except (EOFError, OSError):
            msg = Dead(None)
        if isinstance(msg, Ready):
            self.num_kvcache_blocks, self.state = msg.num_kvcache_blocks, ClientState.READY
            self._reader = threading.Thread(target=self._read, name=f"{self.runner_name}-reader",
                                            daemon=True)
            self._reader.start()
            return
        self.state = ClientState.DEAD
        self.runner.stop(timeout_s=5.0)
        if msg.error is not None:
            raise msg.error  # e.g. a bad checkpoint: the error LLM(...) would raise
        code = self.runner.exitcode()
        # An exit (not a signal) before the core ran at all: most often a script without the
        # __main__ guard, whose re-import in the child failed.
        hint = f"; {GUARD_HINT}" if code is not None and code > 0 else ""
        raise EngineDeadError(f"{self._where()} exited while starting "
                              f"({exit_description(code)}){hint}")

    @property
    def runner_name(self) -> str:
        """The runner's thread or process name: this client's name, dashed."""
        return "nanovllm-" + self.name.replace(" ", "-")

    def is_alive(self) -> bool:
        """Whether the core serves (the process check catches one killed a moment ago)."""
        return self.state is ClientState.READY and self.runner.is_alive()

    # -- commands ---------------------------------------------------------------------------
    def send(self, msg, before: Callable[[], None] | None = None) -> None:
        """Send a command; EngineDeadError naming the core if it is gone. before(), if
        given, runs first under the same lock (e.g. a stream registered for the outputs)."""
        with self._lock:
            if self.state is not ClientState.READY:
                raise self.dead_error()
            if before is not None:
                before()
            try:
                self._inbox.send(msg)
            except OSError as e:  # the core died before the reader saw its pipe close
                raise self.dead_error(wait_s=2.0) from e

    def send_quietly(self, msg) -> None:
        """Send, ignoring a core that is gone (aborting or stopping: nothing to do)."""
        try:
            with self._lock:  # one writer at a time: interleaved pickles would corrupt the pipe
                self._inbox.send(msg)
        except OSError:
            pass

    def send_tokenizer(self, eos_ids: set[int], shipped) -> None:
        """Hand a core started without them (start_pipe_client with eos_ids None) its end
        tokens and tokenizer (a utils.tokenizer.PickledTokenizer, or None); a core that died
        meanwhile reports it at wait_ready()."""
        self.send_quietly(Tokenizer(eos_ids, shipped))

    def add(self, requests: list[Request]) -> None:
        """Queue requests (in order)."""
        self.send(AddRequests(requests))

    def abort(self, request_ids: list[int]) -> None:
        """Abort requests; a core that is gone has nothing to abort."""
        self.send_quietly(Abort(list(request_ids)))

    def stats(self, timeout: float | None = 30.0) -> dict:
        """The core's stats, one round trip away (at most a step)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        token = next(self._tokens)
        self.send(StatsQuery(token), before=lambda: self._stats.__setitem__(token, future))
        return future.result(timeout)

    def shutdown(self) -> None:
        """Ask the core to stop, wait for it (terminate it if it hangs); idempotent."""
        self.request_stop()
        self.join()

    def request_stop(self) -> None:
        """Ask the core to stop without waiting (several clients stop in parallel)."""
        with self._lock:
            if self.state is ClientState.CLOSED:
                return
            self.state = ClientState.CLOSED
        self.send_quietly(Stop())

    def wait_stopped(self) -> None:
        """Block until the core has stopped (shut down, or died: then `error` says why)."""
        if self._reader is not None and threading.current_thread() is not self._reader:
            self._reader.join()

    def join(self) -> None:
        """Wait for the core to end, and its reader with it."""
        self.runner.stop()
        if self._reader is not None and threading.current_thread() is not self._reader:
            self._reader.join()
        self._inbox.close()
        self._outbox.close()

    # -- the reader -------------------------------------------------------------------------
    def _read(self) -> None:
        error = None
        try:
            while True:
                msg = self._outbox.recv()
                if isinstance(msg, Outputs):
                    self.sink(self, msg)
                elif isinstance(msg, Stats):
                    future = self._stats.pop(msg.token, None)
                    if future is not None:
                        future.set_result(msg.stats)
                elif isinstance(msg, Dead):
                    error = msg.error
                    return
        except (EOFError, OSError):
            error = self.dead_error(wait_s=2.0)
        except BaseException as e:
            error = e
            logger.exception("the reader of %s stopped", self.name)
            # Nobody reads the core's pipe any more: closing it makes the core's next send
            # fail, so it stops instead of blocking on a full pipe forever.
            self._outbox.close()
        finally:
            self._died(error)

    def _died(self, error: BaseException | None) -> None:
        """The one death path: mark the core dead, fail what waits, tell the sink."""
        with self._lock:
            closed = self.state is ClientState.CLOSED
            if not closed:
                self.state = ClientState.DEAD
            self.error = error if error is not None or closed else self.dead_error()
        if self.error is not None and not closed:
            logger.error("%s stopped: %s", self.name, self.error)
        dead = self.dead_error()
        for future in list(self._stats.values()):
            future.set_exception(dead)
        self._stats.clear()
        self.sink(self, Dead(dead))

    def _where(self) -> str:
        pid = self.runner.pid
        return self.name if pid is None else f"{self.name} (pid {pid})"

    def dead_error(self, wait_s: float = 0.0) -> EngineDeadError:
        """The error that names this core and why it stopped serving."""
        if self.state is ClientState.CLOSED:
            return EngineDeadError(f"{self.name} has been shut down")
        error = self.error
        if isinstance(error, EngineDeadError):
            return error
        if error is not None:
            how = f"stopped on an error: {type(error).__name__}: {error}"
        else:
            how = f"died ({exit_description(self.runner.exitcode(wait_s or 5.0))})"
        return EngineDeadError(f"{self._where()} {how}; shut it down and create a new engine")
