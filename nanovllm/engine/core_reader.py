"""AsyncLLM's reader thread: the engine core's messages delivered to their request streams."""
import asyncio
import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable

from nanovllm.engine.request_stream import RequestStream

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine core stopped on an error (or was shut down): no request can be served."""


class RequestFailedError(RuntimeError):
    """The engine step running this request raised: the request ended (its blocks freed),
    the engine goes on serving the others."""


class CoreReader:
    """Reads the core -> front end pipe on a thread of its own: each request's new items go to
    its stream, one wake-up per event loop; when the core ends, every open stream and pending
    stats call fails with EngineDeadError."""

    def __init__(self, outbox, exit_code: Callable[[float], int | None]):
        """Start reading `outbox`; exit_code(wait) is the engine process's exit code, if any
        (after waiting up to `wait` seconds for it to end)."""
        self._outbox = outbox
        self._exit_code = exit_code
        self.error: BaseException | None = None  # why the engine core stopped, if it did
        self._streams: dict[int, RequestStream] = {}  # stream key -> stream
        self._stats: dict[int, concurrent.futures.Future] = {}
        self._tokens = itertools.count()
        # Set (under the lock) once the core is gone: an "add" sent after that would wait
        # forever for its reply, so the check and the send share the lock.
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="nanovllm-reader", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        """Whether the thread still reads (the core has not ended)."""
        return self._thread.is_alive()

    def join(self) -> None:
        """Wait for the thread to end (the core's end); a no-op on the thread itself."""
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def add(self, stream: RequestStream, send: Callable[[], None]) -> None:
        """Route the core's items for `stream.key` to `stream` and send() its add;
        EngineDeadError if the core is gone."""
        with self._close_lock:
            if self._closed:
                raise EngineDeadError(dead_message(self.error))
            self._streams[stream.key] = stream
            try:
                send()
            except BaseException as e:  # e.g. params that cannot be pickled
                del self._streams[stream.key]
                if isinstance(e, OSError):
                    raise self._gone() from e
                raise

    def ask_stats(self, send: Callable[[int], None]) -> concurrent.futures.Future:
        """A future for the core's stats, asked with send(token); EngineDeadError if the core
        is gone."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        token = next(self._tokens)
        self._stats[token] = future
        with self._close_lock:
            if self._closed:
                del self._stats[token]
                raise EngineDeadError(dead_message(self.error))
            try:
                send(token)
            except OSError as e:
                del self._stats[token]
                raise self._gone() from e
        return future

    def _gone(self, wait: float = 0.0) -> EngineDeadError:
        """The error for a pipe found closed: the core died (a send may find it so before
        this thread has read the end of the pipe). wait: seconds to let the process end, so
        the error can name its exit code."""
        return EngineDeadError(f"the engine core went away (exit code "
                               f"{self._exit_code(wait)})")

    def _read(self) -> None:
        try:
            while True:
                msg = self._outbox.recv()
                kind = msg[0]
                if kind == "items":
                    self._deliver(msg[1])
                elif kind == "added":
                    self._added(*msg[1:])
                elif kind == "stats":
                    future = self._stats.pop(msg[1], None)
                    if future is not None:
                        future.set_result(msg[2])
                elif kind == "dead":
                    self.error = msg[1]
                    return
        except (EOFError, OSError):
            self.error = self._gone(wait=2.0)
        except BaseException as e:  # noqa: BLE001 - reported to every stream, then logged
            self.error = e
            logger.exception("the reader thread stopped")
            # Nobody reads the core's pipe any more: closing it makes the core's next send
            # fail, so it stops instead of blocking on a full pipe forever.
            self._outbox.close()
        finally:
            if self.error is not None:
                logger.error("the engine core stopped: %r", self.error)
            self._fail_all(EngineDeadError(dead_message(self.error)))

    def _added(self, key: int, reply, error: BaseException | None) -> None:
        stream = self._streams.get(key)
        if stream is None:
            return
        if error is not None:
            del self._streams[key]
        else:
            stream.prompt = reply[1:]
        stream.answered = True
        _call_soon(stream.loop, _settle, stream.reply, error)

    def _deliver(self, news: dict[int, list]) -> None:
        """Hand each stream its items; wake them all, one cross-thread call per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[RequestStream]] = {}
        for key, items in news.items():
            stream = self._streams.get(key)
            if stream is None or not items:
                continue
            stream.items.extend(items)
            if items[-1][0] == "end":
                stream.done = True
                del self._streams[key]
            by_loop.setdefault(stream.loop, []).append(stream)
        for loop, streams in by_loop.items():
            _wake_soon(loop, streams)

    def _fail_all(self, error: BaseException) -> None:
        with self._close_lock:
            self._closed = True
            streams, self._streams = self._streams, {}
        for future in list(self._stats.values()):
            future.set_exception(error)
        self._stats.clear()
        by_loop: dict = {}
        for stream in streams.values():
            if not stream.answered:  # its add was never answered
                _call_soon(stream.loop, _settle, stream.reply, error)
                continue
            stream.fail(error)
            by_loop.setdefault(stream.loop, []).append(stream)
        for loop, group in by_loop.items():
            _wake_soon(loop, group)


def _wake_soon(loop: asyncio.AbstractEventLoop, streams: list[RequestStream]) -> None:
    """Wake every stream in the list on its loop: one cross-thread call for all of them."""
    _call_soon(loop, _wake_all, streams)


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """fn(*args) on loop's thread, soon; nothing if the loop was closed (nobody listens)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _wake_all(streams: list[RequestStream]) -> None:
    for stream in streams:
        stream.wake()


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():  # the caller gave up waiting (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(None)


def dead_message(error: BaseException | None) -> str:
    """What EngineDeadError says once the core has stopped (on `error`, or shut down)."""
    if error is None:
        return "the engine has been shut down"
    if isinstance(error, EngineDeadError):
        return str(error)
    return f"the engine stopped on an error: {type(error).__name__}: {error}"
