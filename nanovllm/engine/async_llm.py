"""AsyncLLM: the engine's step loop on a thread of its own, requests streamed to asyncio.

Every engine call happens on the engine thread: callers (any asyncio task, on one event
loop) hand it commands through a queue and never touch the scheduler or the sequences. Once
per step the thread copies what each request learned (new token ids, logprobs, the end) into
that request's stream and wakes the event loop once for all of them; the consumer turns the
ids into text when it reads (TextStream), so a slow consumer gets several steps' tokens in one
delta instead of slowing the engine down. A request whose consumer stops listening (the
async-for loop is left, or its task cancelled) is aborted and its blocks freed.
"""
import asyncio
import itertools
import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator

from nanovllm.engine import logprobs as lp
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.engine.prompts import conversation_list
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.text_stream import TextStream
from nanovllm.engine.tokenizer import chat_prompt
from nanovllm.outputs import CompletionOutput, RequestOutput
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Waking a stream costs its consumer ~100 us of Python (a RequestOutput, a detokenizing
# window) on the thread that shares the GIL with the engine. Waking every stream every step
# would, at a few hundred streams, keep that thread busy for longer than the step takes and
# starve the engine, so streams are woken at most every DELTA_COST_S x (live streams),
# capped at MAX_WAKE_INTERVAL_S: every step at low load, a few steps' tokens per delta at
# high load (the idea of vLLM's stream_interval, sized automatically).
DELTA_COST_S = 1e-4
MAX_WAKE_INTERVAL_S = 0.05
# Python hands the GIL over every 5 ms by default: the engine thread, back from the device,
# could wait that long for it at every step while a consumer decodes: 0.5 ms bounds the wait
# (measured on H100 with tools/bench_serve.py: better than 1 ms, 0.2 ms worse).
SWITCH_INTERVAL_S = 0.0005


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an error (or was shut down): no request can be served."""


class AsyncLLM:
    """The online engine: `async for out in llm.generate(prompt, params, request_id)` yields
    each request's outputs as deltas (new text and token ids), while one thread steps."""

    def __init__(self, model: str, **kwargs):
        """Same arguments as LLM; the engine is built (and checked) here, then its thread
        starts."""
        self.engine = LLMEngine(model, **kwargs)
        self.config, self.tokenizer = self.engine.config, self.engine.tokenizer
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}  # engine request id -> stream (engine thread)
        self._live: dict[str, _Stream] = {}  # caller's request id -> stream (event loop side)
        self._auto_ids = itertools.count()
        self.error: BaseException | None = None  # why the engine thread stopped, if it did
        self._stopping = False
        # Streams with news that were not woken yet, by event loop; when they last were.
        self._to_wake: dict[asyncio.AbstractEventLoop, dict[int, _Stream]] = {}
        self._last_wake = 0.0
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        # Set (under the lock) once the engine thread takes no more commands: an "add" put
        # after its last drain would wait forever, so the check and the put share the lock.
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="nanovllm-engine", daemon=True)
        self._thread.start()

    # -- the caller's side ------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """Whether the engine thread is alive and serving."""
        return self._thread.is_alive() and self.error is None and not self._stopping

    async def generate(self, prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, priority: int = 0
                       ) -> AsyncIterator[RequestOutput]:
        """Stream one request: RequestOutputs whose completions carry the text, token ids
        and logprobs that are new since the previous one (one completion per sample that
        moved; `finished` on the last). Bad input raises ValueError before anything is
        yielded; leaving the loop early aborts the request."""
        stream = await self._add(prompt, sampling_params, request_id, priority)
        try:
            while True:
                out = await stream.next_output()
                yield out
                if out.finished:
                    return
        finally:
            if self._live.get(stream.request_id) is stream:
                del self._live[stream.request_id]
            if not stream.done:
                self._inbox.put(("abort", stream))

    async def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None,
                   request_id: str | None = None, priority: int = 0,
                   chat_template: str | None = None) -> AsyncIterator[RequestOutput]:
        """generate() for one conversation, through the chat template."""
        conversations = conversation_list(messages)
        if len(conversations) != 1:
            raise ValueError(f"AsyncLLM.chat takes one conversation (a list of messages), got "
                             f"{len(conversations)}: call it once per conversation")
        prompt = chat_prompt(self.tokenizer, conversations[0], chat_template, True)
        async for out in self.generate(prompt, sampling_params, request_id, priority):
            yield out

    async def abort(self, request_id: str) -> None:
        """Abort a request by the id given to generate(); unknown or finished ids: a no-op."""
        stream = self._live.get(request_id)
        if stream is not None:
            self._inbox.put(("abort", stream))

    def shutdown(self) -> None:
        """Stop the engine thread (streams still open end with EngineDeadError), then the
        engine. Idempotent."""
        if not self._stopping:
            self._stopping = True
            self._inbox.put(("stop", None))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        self.engine.shutdown()

    async def _add(self, prompt, sp, request_id, priority) -> "_Stream":
        if not self.is_running:
            raise EngineDeadError(_dead_message(self.error))
        if request_id is None:
            request_id = f"req-{next(self._auto_ids)}"
        elif request_id in self._live:
            raise ValueError(f"request_id {request_id!r} is already in use by a running request")
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, request_id, self.engine.text)
        self._live[request_id] = stream
        reply = loop.create_future()
        with self._close_lock:
            if self._closed:
                del self._live[request_id]
                raise EngineDeadError(_dead_message(self.error))
            self._inbox.put(("add", (prompt, sp, priority, stream, reply)))
        try:
            await reply
        except BaseException:
            del self._live[request_id]
            # Cancelled while the engine thread adds it: the abort comes after the add.
            self._inbox.put(("abort", stream))
            raise
        return stream

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                # Idle: wake the streams with news, then sleep until a command comes; busy:
                # take what is there and step.
                if engine.is_finished():
                    self._wake()
                    cmd = self._inbox.get()
                else:
                    cmd = _get_nowait(self._inbox)
                while cmd is not None:
                    if cmd[0] == "stop":
                        return
                    self._command(*cmd)
                    cmd = _get_nowait(self._inbox)
                if not engine.is_finished():
                    self._publish(*engine.step_updates())
        except BaseException as e:  # noqa: BLE001 - reported to every stream, then logged
            self.error = e
            logger.exception("the engine thread stopped")
        finally:
            self._fail_all(EngineDeadError(_dead_message(self.error)))

    def _command(self, kind: str, arg) -> None:
        if kind == "abort":
            if arg.engine_id >= 0 and not arg.done:
                self.engine.abort_request(arg.engine_id)
            return
        prompt, sp, priority, stream, reply = arg
        try:
            engine_id = self.engine.add_request(prompt, sp, priority)
        except Exception as e:  # noqa: BLE001 - a bad request goes back to its caller
            stream.loop.call_soon_threadsafe(_settle, reply, None, e)
            return
        stream.engine_id = engine_id
        self._streams[engine_id] = stream
        stream.loop.call_soon_threadsafe(_settle, reply, engine_id, None)

    def _publish(self, updated: list[Sequence], finished: list[Sequence]) -> None:
        """Copy what the step's requests learned into their streams; wake them when due."""
        for seq in updated:
            stream = self._streams.get(seq.request_id)
            if stream is not None:
                stream.push(seq, self.engine)
                self._to_wake.setdefault(stream.loop, {})[seq.request_id] = stream
        for req in finished:
            stream = self._streams.pop(req.seq_id, None)
            if stream is not None:
                stream.push_end(req, self.engine)
                self._to_wake.setdefault(stream.loop, {})[req.seq_id] = stream
        due = min(DELTA_COST_S * len(self._streams), MAX_WAKE_INTERVAL_S)
        if time.perf_counter() - self._last_wake >= due:
            self._wake()

    def _wake(self) -> None:
        """Wake every stream with news: one cross-thread call per event loop."""
        for loop, streams in self._to_wake.items():
            _wake_soon(loop, list(streams.values()))
        self._to_wake = {}
        self._last_wake = time.perf_counter()

    def _fail_all(self, error: BaseException) -> None:
        self._wake()  # ended streams not woken yet get their last outputs first
        streams, self._streams = self._streams, {}
        with self._close_lock:
            self._closed = True
            while True:  # requests still queued: their callers wait for a reply
                cmd = _get_nowait(self._inbox)
                if cmd is None:
                    break
                if cmd[0] == "add":
                    _prompt, _sp, _priority, stream, reply = cmd[1]
                    stream.loop.call_soon_threadsafe(_settle, reply, None, error)
        for stream in streams.values():
            stream.fail(error)
        by_loop: dict = {}
        for stream in streams.values():
            by_loop.setdefault(stream.loop, []).append(stream)
        for loop, group in by_loop.items():
            _wake_soon(loop, group)


class _Stream:
    """One request's outputs in transit: filled on the engine thread, read on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request_id: str, text):
        self.loop, self.request_id = loop, request_id
        self.engine_id = -1  # set on the engine thread once the request is added
        self._text = text  # the engine's TextDecoder
        self._event = asyncio.Event()
        # What the engine thread sent since the last read (deque: appends and pops are atomic
        # under the GIL, a list swap is not).
        self._items: deque = deque()
        self.done = False  # the engine has nothing more for this request
        self._error: BaseException | None = None
        # Engine-thread state: per sample, how many tokens were copied; samples that ended.
        self._copied: dict[int, int] = {}
        self._ended: set[int] = set()
        # Loop-side state: per sample, its text so far and cumulative logprob.
        self._texts: dict[int, TextStream] = {}
        self._cum: dict[int, float] = {}
        self._prompt: tuple = (None, [])

    # -- engine thread ----------------------------------------------------------------------
    def push(self, seq: Sequence, engine: LLMEngine) -> None:
        """A sample's newly known tokens (with their logprob entries), and its end if it
        ended."""
        if seq.index in self._ended:
            return
        req = seq.request
        self._prompt = (req.prompt, req.prompt_token_ids)
        start = self._copied.get(seq.index, 0)
        # Only the new ids: slicing completion_token_ids first would copy the whole output.
        base = seq.num_prompt_tokens
        ids = seq.token_ids[base + start: seq.num_tokens - seq.num_pending]
        self._copied[seq.index] = start + len(ids)
        entries = None if seq.logprobs is None else seq.logprobs[start:start + len(ids)]
        stops = seq.sampling_params.stop
        if not seq.is_finished:
            if ids:
                self._items.append((seq.index, ids, entries, stops, None))
            return
        self._ended.add(seq.index)
        end = (engine.text.completion_text(seq), seq.finish_reason, seq.stop_reason)
        self._items.append((seq.index, ids, entries, stops, end))

    def push_end(self, req: Sequence, engine: LLMEngine) -> None:
        """The request ended: samples not ended yet (aborted ones), then the end itself."""
        for seq in req.samples:
            self.push(seq, engine)
        # Samples never forked (the request was aborted before its prompt was computed).
        empty = None if req.logprobs is None else []
        for index in range(len(req.samples), req.sampling_params.n):
            self._items.append((index, [], empty, None, ("", req.finish_reason, None)))
        self._items.append(lp.prompt_logprobs(req, engine.text.token_text))
        self.done = True

    def fail(self, error: BaseException) -> None:
        self._error, self.done = error, True

    # -- event loop -------------------------------------------------------------------------
    def wake(self) -> None:
        self._event.set()

    async def next_output(self) -> RequestOutput:
        """The next delta: everything that arrived since the last one."""
        while not self._items and self._error is None:
            self._event.clear()
            await self._event.wait()
        if self._error is not None and not self._items:
            raise self._error
        items = [self._items.popleft() for _ in range(len(self._items))]
        return self._delta(items)

    def _delta(self, items: list) -> RequestOutput:
        parts: dict[int, list] = {}  # sample index -> [ids, entries, text, end]
        finished, prompt_lps = False, None
        for item in items:
            if not isinstance(item, tuple):  # the request's end: its prompt logprobs
                finished, prompt_lps = True, item
                continue
            index, ids, entries, stops, end = item
            part = parts.setdefault(index, [[], None, "", None])
            text = self._texts.get(index)
            if text is None:
                text = self._texts[index] = TextStream(self._text.decode, stops)
            part[0] += ids
            if entries is not None:
                part[1] = (part[1] or []) + entries
            if end is None:
                part[2] += text.add(ids)
            else:  # the final text, cut at a stop string, replaces the held-back tail
                text.token_ids += ids
                part[2] += text.finish(end[0])
                part[3] = end
        completions = []
        for index in sorted(parts):
            ids, entries, text, end = parts[index]
            fields = lp.completion_fields(entries, ids, self._text.token_text)
            if fields["cumulative_logprob"] is not None:
                total = self._cum.get(index, 0.0) + fields["cumulative_logprob"]
                self._cum[index] = fields["cumulative_logprob"] = total
            reason, stop_reason = (None, None) if end is None else end[1:]
            completions.append(CompletionOutput(index=index, text=text, token_ids=ids,
                                                finish_reason=reason, stop_reason=stop_reason,
                                                **fields))
        prompt, prompt_ids = self._prompt
        return RequestOutput(request_id=self.request_id, prompt=prompt,
                             prompt_token_ids=prompt_ids, outputs=completions,
                             finished=finished, prompt_logprobs=prompt_lps)


def _wake_soon(loop: asyncio.AbstractEventLoop, streams: list[_Stream]) -> None:
    """Wake every stream in the list on its loop: one cross-thread call for all of them."""
    try:
        loop.call_soon_threadsafe(_wake_all, streams)
    except RuntimeError:  # the loop was closed: nobody is listening any more
        pass


def _wake_all(streams: list[_Stream]) -> None:
    for stream in streams:
        stream.wake()


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.done():  # the caller gave up waiting (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _get_nowait(q: queue.SimpleQueue):
    try:
        return q.get_nowait()
    except queue.Empty:
        return None


def _dead_message(error: BaseException | None) -> str:
    if error is None:
        return "the engine has been shut down"
    return f"the engine stopped on an error: {type(error).__name__}: {error}"
