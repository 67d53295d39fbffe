"""The engine core of the online engine: LLMEngine's step loop driven by commands on a pipe.

AsyncLLM (the front end) sends commands down one pipe and reads what each request learned
from another. The same loop runs on a thread of the front end's process (the engine
reachable in-process, e.g. for tests) or in a process of its own (the default): there the
step loop never waits for the GIL while the front end detokenizes and writes HTTP responses,
which at a few hundred streams is what kept the server at less than half of the offline
throughput. No torch here: the engine process imports it when it builds the engine.

Front end -> core: ("add", key, prompt, params, priority), ("abort", key), ("stats", token),
("stop",). Core -> front end: ("ready", config), ("added", key, reply, error),
("items", {key: [item, ...]}), ("stats", token, dict), ("dead", error or None) last.
An item is ("sample", index, new ids, logprob entries, stop strings, end or None) or
("end", prompt logprobs); `end` is (final text, finish reason, stop reason). A core started
with stream=False (a data-parallel replica: LLM.generate wants whole results) sends one item
per request instead, when it ends: ("output", its RequestOutput, as LLMEngine.step makes it).
"""
import logging
import pickle
import signal
import time
from multiprocessing.connection import Connection

from nanovllm.engine import logprobs as lp
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.engine.sequence import Sequence

logger = logging.getLogger(__name__)

# Each delta costs its consumer ~100 us of Python (a RequestOutput, a detokenizing window),
# so sending every stream's tokens every step would, at a few hundred streams, make the
# front end the bottleneck: news is sent at most every DELTA_COST_S x (live streams),
# capped at MAX_SEND_INTERVAL_S: every step at low load, a few steps' tokens per delta at
# high load (the idea of vLLM's stream_interval, sized automatically).
DELTA_COST_S = 1e-4
MAX_SEND_INTERVAL_S = 0.05


class EngineCore:
    """An LLMEngine and, per request, what its stream was already sent."""

    def __init__(self, engine: LLMEngine, stream: bool = True):
        self.engine, self.stream = engine, stream
        self._keys: dict[int, int] = {}  # engine request id -> front end's stream key
        self._ids: dict[int, int] = {}  # stream key -> engine request id
        self._copied: dict[tuple[int, int], int] = {}  # (key, sample) -> tokens sent
        self._ended: set[tuple[int, int]] = set()
        self.num_aborted = 0  # aborts that stopped a live request (stats, tests)

    @property
    def num_live(self) -> int:
        """Requests added and not ended."""
        return len(self._keys)

    def add(self, key: int, prompt, params, priority) -> tuple:
        """Queue a request; returns (engine id, prompt text, prompt token ids)."""
        req = self.engine.add_sequence(prompt, params, priority)
        self._keys[req.seq_id], self._ids[key] = key, req.seq_id
        return req.seq_id, req.prompt, req.prompt_token_ids

    def abort(self, key: int) -> None:
        """Abort a stream's request (a no-op once it ended or if it was never added)."""
        engine_id = self._ids.get(key)
        if engine_id is not None:
            self.num_aborted += 1
            self.engine.abort_request(engine_id)

    def step(self, out: dict[int, list]) -> None:
        """Run one engine step; append each stream's new items to out[key]."""
        if not self.stream:
            self._step_outputs(out)
            return
        updated, finished = self.engine.step_updates()
        for seq in updated:
            key = self._keys.get(seq.request_id)
            if key is None:
                continue
            # A chunk of a prompt, or a token still in flight, brings nothing to send.
            items = self._push([], key, seq)
            if items:
                out.setdefault(key, []).extend(items)
        for req in finished:
            key = self._keys.pop(req.seq_id, None)
            if key is None:
                continue
            del self._ids[key]
            items = out.setdefault(key, [])
            for seq in req.samples:
                self._push(items, key, seq)
            # Samples never forked (the request was aborted before its prompt was computed).
            empty = None if req.logprobs is None else []
            for index in range(len(req.samples), req.sampling_params.n):
                items.append(("sample", index, [], empty, None, ("", req.finish_reason, None)))
            items.append(("end", lp.prompt_logprobs(req, self.engine.text.token_text)))
            for index in range(req.sampling_params.n):
                self._copied.pop((key, index), None)
                self._ended.discard((key, index))

    def _step_outputs(self, out: dict[int, list]) -> None:
        """Run one engine step; each request that ended gets its whole RequestOutput."""
        outputs, _ = self.engine.step()
        for output in outputs:
            key = self._keys.pop(output.request_id, None)
            if key is not None:
                del self._ids[key]
                out[key] = [("output", output)]

    def _push(self, items: list, key: int, seq: Sequence) -> list:
        """Append a sample's newly known tokens (with their logprob entries), and its end if
        it ended, to items; returns items."""
        at = (key, seq.index)
        if at in self._ended:
            return items
        start = self._copied.get(at, 0)
        # Only the new ids: slicing completion_token_ids first would copy the whole output.
        base = seq.num_prompt_tokens
        ids = seq.token_ids[base + start: seq.num_tokens - seq.num_pending]
        self._copied[at] = start + len(ids)
        entries = None if seq.logprobs is None else seq.logprobs[start:start + len(ids)]
        stops = seq.sampling_params.stop
        if not seq.is_finished:
            if ids:
                items.append(("sample", seq.index, ids, entries, stops, None))
            return items
        self._ended.add(at)
        end = (self.engine.text.completion_text(seq), seq.finish_reason, seq.stop_reason)
        items.append(("sample", seq.index, ids, entries, stops, end))
        return items

    def stats(self) -> dict:
        """KV blocks, queues and counters: what a health check or a test looks at."""
        bm = self.engine.scheduler.block_manager
        return dict(num_blocks=bm.num_blocks, num_free_blocks=bm.num_free_blocks,
                    num_live_requests=self.num_live, idle=self.engine.is_finished(),
                    num_aborted=self.num_aborted)


def run_core(engine: LLMEngine, inbox: Connection, outbox: Connection,
             stream: bool = True) -> None:
    """Serve commands from `inbox` until "stop" (or the front end goes away), stepping
    while there is work; the last message sent is ("dead", error or None). stream=False:
    whole outputs of ended requests instead of streamed items."""
    core, pending, last_send = EngineCore(engine, stream), {}, 0.0
    error = None

    def flush():
        nonlocal pending, last_send
        if pending:
            outbox.send(("items", pending))
            pending = {}
        last_send = time.perf_counter()

    try:
        outbox.send(("ready", engine.config))
        while True:
            # Idle: send what is left, then sleep until a command comes; busy: take what is
            # there and step.
            if engine.is_finished():
                flush()
                if not _command(core, inbox.recv(), outbox):
                    return
            while inbox.poll():
                if not _command(core, inbox.recv(), outbox):
                    return
            if not engine.is_finished():
                core.step(pending)
                due = min(DELTA_COST_S * core.num_live, MAX_SEND_INTERVAL_S)
                if time.perf_counter() - last_send >= due:
                    flush()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the front end is gone: nobody to tell
    except BaseException as e:  # noqa: BLE001 - reported to the front end, then logged
        error = e
        logger.exception("the engine core stopped")
    finally:
        try:
            flush()
            outbox.send(("dead", _picklable(error)))
        except (OSError, EOFError):
            pass


def _command(core: EngineCore, cmd: tuple, outbox: Connection) -> bool:
    """Carry out one command; False for "stop"."""
    kind = cmd[0]
    if kind == "abort":
        core.abort(cmd[1])
    elif kind == "add":
        _, key, prompt, params, priority = cmd
        try:
            reply, error = core.add(key, prompt, params, priority), None
        except Exception as e:  # noqa: BLE001 - a bad request goes back to its caller
            reply, error = None, _picklable(e)
        outbox.send(("added", key, reply, error))
    elif kind == "stats":
        outbox.send(("stats", cmd[1], core.stats()))
    elif kind == "stop":
        return False
    return True


def _picklable(error: BaseException | None) -> BaseException | None:
    """error itself if it survives pickling (it crosses a pipe), else a RuntimeError with its
    text."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return RuntimeError(f"{type(error).__name__}: {error}")


def core_process_main(model: str, kwargs: dict, inbox: Connection, outbox: Connection,
                      log_level: int = logging.WARNING, stream: bool = True) -> None:
    """Entry point of the engine process: build the engine (a failure is reported as
    "dead"), then run the core until stopped (stream: see run_core)."""
    # Ctrl-C reaches every process of the terminal's group: the front end decides when the
    # engine stops (it finishes or aborts requests first), so the core ignores SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        engine = LLMEngine(model, **kwargs)
    except BaseException as e:  # noqa: BLE001 - the front end raises it from its constructor
        outbox.send(("dead", _picklable(e)))
        return
    try:
        run_core(engine, inbox, outbox, stream)
    finally:
        engine.shutdown()
