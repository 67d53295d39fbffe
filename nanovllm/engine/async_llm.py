"""AsyncLLM: the online engine's front end; requests streamed to asyncio.

The engine itself runs in an engine core (engine_core.py): by default a process of its own, so
its step loop never waits for the GIL while this process detokenizes and serves HTTP; with
engine_process=False a thread of this process (the engine then in reach, as `self.engine`).
Either way the two sides talk over pipes: callers (asyncio tasks, on any event loop) send
commands, and one reader thread (core_reader.py) takes what each request learned (new token
ids, logprobs, the end), appends it to the request's stream and wakes the event loop once for
all of them. The consumer turns ids into text when it reads (TextStream), so a slow consumer
gets several steps' tokens in one delta instead of slowing the engine down. A request whose
consumer stops listening (the async-for loop is left, or its task cancelled) is aborted and
its blocks freed.
"""
import asyncio
import atexit
import itertools
import logging
import multiprocessing as mp
import sys
import threading
from collections.abc import AsyncIterator

from nanovllm.config import Config
from nanovllm.engine.core_reader import (CoreReader, EngineDeadError, RequestFailedError,
                                         dead_message)
from nanovllm.engine.engine_core import core_process_main, run_core
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.engine.prompts import conversation_list
from nanovllm.engine.request_stream import RequestStream
from nanovllm.engine.tokenizer import TextDecoder, chat_prompt, load_tokenizer
from nanovllm.outputs import RequestOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.exit_status import exit_description
from nanovllm.utils.spawn import GUARD_HINT, spawn_context

logger = logging.getLogger(__name__)

# Python hands the GIL over every 5 ms by default: the reader thread (or the engine thread,
# in-process) could wait that long for it at every message while a consumer decodes; 0.5 ms
# bounds the wait (measured on H100 with tools/bench_serve.py: better than 1 ms and 0.2 ms).
SWITCH_INTERVAL_S = 0.0005
# How long shutdown() waits for the engine process to stop before it is terminated.
STOP_TIMEOUT_S = 30.0


class AsyncLLM:
    """The online engine: `async for out in llm.generate(prompt, params, request_id)` yields
    each request's outputs as deltas (new text and token ids), while the engine core steps."""

    def __init__(self, model: str, engine_process: bool = True, **kwargs):
        """Same arguments as LLM, plus engine_process: run the engine in a process of its own
        (default; faster under load) or on a thread of this one. Returns once the engine is
        built; a bad argument or a failed start raises here."""
        self.engine: LLMEngine | None = None
        self._proc = self._thread = None
        to_core, self._inbox = mp.Pipe(duplex=False)  # front end -> core
        self._outbox, from_core = mp.Pipe(duplex=False)  # core -> front end
        if engine_process:
            # Checked here so a bad argument raises ValueError before a process starts.
            config = Config.from_kwargs(model, **kwargs)
            ctx = spawn_context("AsyncLLM")
            level = logging.getLogger().getEffectiveLevel()
            self._proc = ctx.Process(target=core_process_main, name="nanovllm-engine",
                                     args=(model, kwargs, to_core, from_core, level))
            self._proc.start()
            to_core.close()
            from_core.close()
            tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.tokenizer)
            self._text = TextDecoder(tokenizer)
        else:
            self.engine = LLMEngine(model, **kwargs)
            tokenizer, self._text = self.engine.tokenizer, self.engine.text
            self._thread = threading.Thread(target=run_core, name="nanovllm-engine",
                                            args=(self.engine, to_core, from_core),
                                            daemon=True)
            self._thread.start()
        self.tokenizer = tokenizer
        self.config = self._wait_ready()
        self._live: dict[str, RequestStream] = {}  # caller's request id -> stream (event loop side)
        self._keys, self._auto_ids = itertools.count(), itertools.count()
        self._stopping = False
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._send_lock = threading.Lock()
        self._reader = CoreReader(self._outbox, self._exit_code)
        atexit.register(self.shutdown)

    def _wait_ready(self) -> Config:
        """The engine's config, once the core has built the engine; its error if it failed."""
        try:
            msg = self._outbox.recv()
        except EOFError:
            msg = ("dead", None)
        if msg[0] == "ready":
            return msg[1]
        self._join_core()
        error = msg[1]
        if error is None:
            code = self._exit_code()
            # An exit (not a signal) before the core ran at all: most often a script without
            # the __main__ guard, whose re-import in the child failed.
            hint = f"; {GUARD_HINT}" if code is not None and code > 0 else ""
            error = EngineDeadError(f"the engine process exited while starting "
                                    f"({exit_description(code)}){hint}")
        raise error

    def _exit_code(self, wait: float = 0.0) -> int | None:
        """The engine process's exit code; wait: seconds to let a dying one finish."""
        if self._proc is None:
            return None
        if wait:
            self._proc.join(wait)
        return self._proc.exitcode

    # -- the caller's side ------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """Whether the engine core is alive and serving."""
        # The process check catches a core killed a moment ago, before its pipe's end is read.
        return (self._reader.is_alive() and self.error is None and not self._stopping
                and (self._proc is None or self._proc.is_alive()))

    @property
    def error(self) -> BaseException | None:
        """Why the engine core stopped, if it did."""
        return self._reader.error

    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without sampling_params gets: SamplingParams' defaults overridden by
        the model's generation_config.json (a server fills omitted fields from it)."""
        return SamplingParams(**self.config.generation_defaults.sampling)

    async def generate(self, prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, priority: int = 0
                       ) -> AsyncIterator[RequestOutput]:
        """Stream one request: RequestOutputs whose completions carry the text, token ids
        and logprobs that are new since the previous one (one completion per sample that
        moved; `finished` on the last). Bad input raises ValueError before anything is
        yielded; leaving the loop early aborts the request; RequestFailedError if the engine step
        running it raised (the engine serves on)."""
        stream = await self._add(prompt, sampling_params, request_id, priority)
        try:
            while True:
                out = await stream.next_output()
                failed = next((c for c in out.outputs if c.finish_reason == "error"), None)
                if failed is not None:  # the step that ran it raised (see LLMEngine._step)
                    raise RequestFailedError(f"request {stream.request_id!r} failed in the "
                                             f"engine: {failed.stop_reason}")
                yield out
                if out.finished:
                    return
        finally:
            if self._live.get(stream.request_id) is stream:
                del self._live[stream.request_id]
            if not stream.done:
                self._send_quietly(("abort", stream.key))

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
            self._send_quietly(("abort", stream.key))

    def stats(self, timeout: float = 30.0) -> dict:
        """The engine's KV blocks (num_blocks, num_free_blocks), live requests, whether it is
        idle, and how many requests were aborted while running. Blocks for one round trip to
        the core (at most a step)."""
        future = self._reader.ask_stats(lambda token: self._send(("stats", token)))
        return future.result(timeout)

    def wait_stopped(self) -> None:
        """Block until the engine core has stopped (shut down, or died: then `error` says
        why)."""
        self._reader.join()

    def shutdown(self) -> None:
        """Stop the engine core (streams still open end with EngineDeadError), then the
        engine. Idempotent."""
        if not self._stopping:
            self._stopping = True
            self._send_quietly(("stop",))
        self._reader.join()
        self._join_core()
        if self.engine is not None:
            self.engine.shutdown()
        atexit.unregister(self.shutdown)

    def _join_core(self) -> None:
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join()
        if self._proc is not None:
            self._proc.join(STOP_TIMEOUT_S)
            if self._proc.is_alive():
                logger.warning("the engine process did not stop in %.0f s: terminating it",
                               STOP_TIMEOUT_S)
                self._proc.terminate()
                self._proc.join()

    async def _add(self, prompt, sp, request_id, priority) -> "RequestStream":
        if not self.is_running:
            raise EngineDeadError(dead_message(self.error))
        if request_id is None:
            request_id = f"req-{next(self._auto_ids)}"
        elif request_id in self._live:
            raise ValueError(f"request_id {request_id!r} is already in use by a running request")
        loop = asyncio.get_running_loop()
        stream = RequestStream(loop, request_id, next(self._keys), self._text)
        self._live[request_id] = stream
        try:
            self._reader.add(stream, lambda: self._send(("add", stream.key, prompt, sp, priority)))
        except BaseException:  # the core is gone, or e.g. params that cannot be pickled
            del self._live[request_id]
            raise
        try:
            await stream.reply
        except BaseException:
            del self._live[request_id]
            # Cancelled while the core adds it: the abort comes after the add.
            self._send_quietly(("abort", stream.key))
            raise
        return stream

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            self._inbox.send(msg)

    def _send_quietly(self, msg: tuple) -> None:
        """Send, ignoring a core that is gone (aborting or stopping a dead engine: nothing
        to do)."""
        try:
            self._send(msg)
        except OSError:
            pass
