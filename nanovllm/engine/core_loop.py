"""An EngineCore served over a pipe: commands in, outputs out, stepping while there is work.

It runs in a process of its own (a child process client: the step loop never waits for the
GIL while the front end detokenizes and writes HTTP responses, which at a few hundred
streams kept the server at less than half of the offline throughput) or on a thread of the
front end's process. No torch here.
"""
import logging
import pickle
import time
from multiprocessing.connection import Connection

from nanovllm.engine.core import EngineCore
from nanovllm.engine.messages import (Abort, AddRequests, Dead, Outputs, Ready, RequestEnd,
                                      SampleDelta, Stats, StatsQuery, Stop)

logger = logging.getLogger(__name__)

# Each delta costs its consumer ~100 us of Python (a RequestOutput, a detokenizing window),
# so sending every stream's tokens every step would, at a few hundred streams, make the
# front end the bottleneck: news is sent at most every DELTA_COST_S x (live streams),
# capped at MAX_SEND_INTERVAL_S: every step at low load, a few steps' tokens per delta at
# high load (the idea of vLLM's stream_interval, sized automatically).
DELTA_COST_S = 1e-4
MAX_SEND_INTERVAL_S = 0.05


def serve_core(core: EngineCore, inbox: Connection, outbox: Connection) -> None:
    """Send Ready, then serve commands from `inbox` until Stop (or the front end goes away),
    stepping while there is work; the last message sent is Dead(error or None)."""
    pending, last_send, error = Outputs(), 0.0, None

    def flush():
        nonlocal pending, last_send
        if pending:
            pending.coalesce()
            outbox.send(pending)
            pending = Outputs()
        last_send = time.perf_counter()

    try:
        outbox.send(Ready(core.scheduler.block_manager.num_blocks))
        while True:
            # Idle: send what is left, then sleep until a command comes; busy: take what is
            # there and step.
            if core.is_finished():
                flush()
                if not _command(core, inbox.recv(), outbox, pending):
                    return
            while inbox.poll():
                if not _command(core, inbox.recv(), outbox, pending):
                    return
            if not core.is_finished():
                pending.extend(core.step())
                due = min(DELTA_COST_S * core.num_live, MAX_SEND_INTERVAL_S)
                if time.perf_counter() - last_send >= due:
                    flush()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the front end is gone: nobody to tell
    except BaseException as e:
        error = e
        logger.exception("the engine core stopped")
    finally:
        try:
            flush()
            outbox.send(Dead(picklable(error)))
        except (OSError, EOFError):
            pass


def _command(core: EngineCore, msg, outbox: Connection, pending: Outputs) -> bool:
    """Carry out one command; False for Stop."""
    if isinstance(msg, AddRequests):
        for request in msg.requests:
            try:
                core.add(request)
            except Exception as e:
                logger.exception("the engine core refused a request")
                why = f"{type(e).__name__}: {e}"
                pending.samples.append(SampleDelta(request.request_id, 0, [], None, "error", why))
                pending.ended.append(RequestEnd(request.request_id, "error", None))
    elif isinstance(msg, Abort):
        core.abort(msg.request_ids)
    elif isinstance(msg, StatsQuery):
        outbox.send(Stats(msg.token, core.stats()))
    elif isinstance(msg, Stop):
        return False
    return True


def picklable(error: BaseException | None) -> BaseException | None:
    """error itself if it survives pickling (it crosses a pipe), else a RuntimeError with its
    text."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return RuntimeError(f"{type(error).__name__}: {error}")
