"""AsyncLLM: the online front end; requests streamed to asyncio over one engine client.

The engine core runs in a process of its own by default, so its step loop never waits for
the GIL while this process detokenizes and serves HTTP; with engine_process=False it runs on
a thread of this process (then in reach, as `self.core`). Either way this side processes the
inputs (engine/inputs.py), sends Requests down a pipe, and the client's one reader thread
appends what the core reports to each request's stream and wakes each event loop once for
all of them. The consumer builds its delta when it reads (engine/output_processor.py), so a
slow consumer gets several steps' tokens in one delta instead of slowing the engine down. A
request whose consumer stops listening (the async-for loop is left, or its task cancelled)
is aborted and its blocks freed.
"""
import asyncio
import atexit
import itertools
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import replace

from nanovllm.config import STREAMING_PREFILL_GRAPH_TOKENS, Config
from nanovllm.engine.client import EngineDeadError, RequestFailedError
from nanovllm.engine.inputs import InputProcessor
from nanovllm.engine.messages import Abort, AddRequests, Dead, Outputs
from nanovllm.engine.output_processor import RequestState, failure
from nanovllm.engine.pipe_client import PipeClient
from nanovllm.engine.prompts import conversation_list
from nanovllm.engine.request_stream import RequestStream, wake_soon
from nanovllm.engine.tokenizer import TextDecoder, resolve_eos_ids
from nanovllm.outputs import RequestOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.structured import validate as validate_structured
from nanovllm.utils.process import start_context
from nanovllm.utils.tokenizer import load_tokenizer

__all__ = ["AsyncLLM", "EngineDeadError", "RequestFailedError"]

logger = logging.getLogger(__name__)

# Python hands the GIL over every 5 ms by default: the reader thread (or the engine thread,
# in-process) could wait that long for it at every message while a consumer decodes; 0.5 ms
# bounds the wait (measured on H100 with tools/bench_serve.py: better than 1 ms and 0.2 ms).
SWITCH_INTERVAL_S = 0.0005


class AsyncLLM:
    """The online engine: `async for out in llm.generate(prompt, params, request_id)` yields
    each request's outputs as deltas (new text and token ids), while the engine core steps."""

    def __init__(self, model: str, engine_process: bool = True, **kwargs):
        """Same arguments as LLM, plus engine_process: run the engine in a process of its own
        (default; faster under load) or on a thread of this one. Returns once the engine is
        built; a bad argument or a failed start raises here."""
        # Here, not at the top: the device side (torch) comes in with the core.
        from nanovllm.launch import hand_over_tokenizer, start_pipe_client

        if engine_process:  # an unguarded script re-imported by a spawned child: say so first
            start_context("AsyncLLM")
        if kwargs.get("prefill_graph_tokens") is None:
            # Prompts arrive one by one here: each eager prefill step would stall every
            # stream (H100, 32 requests/s: TPOT p50 / p99 8.8 / 13.1 ms eager, 4.6 / 5.0
            # with the graphs; docs/PERF_NOTES.md, 2026-11-25).
            kwargs["prefill_graph_tokens"] = STREAMING_PREFILL_GRAPH_TOKENS
        self.config = config = Config.from_kwargs(model, **kwargs)
        self._streams: dict[int, RequestStream] = {}  # key -> stream (reader thread side)
        self._live: dict[str, RequestStream] = {}  # caller's request id -> stream (loop side)
        self._keys, self._auto_ids = itertools.count(), itertools.count()
        if engine_process:
            # The engine process builds the model while this one loads the tokenizer (seconds
            # each on a fresh machine; one after the other they added up), then gets it.
            self.client: PipeClient = start_pipe_client(
                config, None, None, True, "the engine core", self._on_message, "AsyncLLM")
            try:
                self.tokenizer = self._load_tokenizer()
                eos_ids = resolve_eos_ids(config, self.tokenizer)
            except BaseException:
                self.client.shutdown()
                raise
            hand_over_tokenizer([self.client], eos_ids, self.tokenizer)
        else:
            self.tokenizer = self._load_tokenizer()
            self.client = start_pipe_client(
                config, resolve_eos_ids(config, self.tokenizer), self.tokenizer, True,
                "the engine core", self._on_message, "AsyncLLM", in_process=True)
        self.text = TextDecoder(self.tokenizer)
        self.core = self.client.core  # the EngineCore on this process's thread, or None
        self.client.wait_ready()
        self.inputs = InputProcessor(config, self.tokenizer, self.client.num_kvcache_blocks,
                                     validate_structured)
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        atexit.register(self.shutdown)

    def _load_tokenizer(self):
        return None if self.config.skip_tokenizer_init else load_tokenizer(self.config.tokenizer)

    # -- the caller's side ------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """Whether the engine core is alive and serving."""
        return self.client.is_alive()

    @property
    def error(self) -> BaseException | None:
        """Why the engine core stopped, if it did."""
        return self.client.error

    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without sampling_params gets: SamplingParams' defaults overridden by
        the model's generation_config.json (a server fills omitted fields from it)."""
        return self.inputs.default_params()

    async def generate(self, prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, priority: int = 0
                       ) -> AsyncIterator[RequestOutput]:
        """Stream one request: RequestOutputs whose completions carry the text, token ids
        and logprobs that are new since the previous one (one completion per sample that
        moved; `finished` on the last). Bad input raises ValueError before anything is
        yielded; leaving the loop early aborts the request; RequestFailedError if the engine
        step running it raised (the engine serves on)."""
        stream = self._add(prompt, sampling_params, request_id, priority)
        try:
            while True:
                out = await stream.next_output()
                why = failure(out)
                if why is not None:  # the step that ran it raised (see EngineCore)
                    # Tokens made before the failing step (they may arrive with its news)
                    # still reach the consumer, then the error.
                    partial = _before_failure(out)
                    if partial is not None:
                        yield partial
                    raise RequestFailedError(f"request {stream.request_id!r} failed in the "
                                             f"engine: {why}")
                yield out
                if out.finished:
                    return
        finally:
            if self._live.get(stream.request_id) is stream:
                del self._live[stream.request_id]
            if not stream.done:
                self.client.send_quietly(Abort([stream.key]))

    async def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None,
                   request_id: str | None = None, priority: int = 0,
                   chat_template: str | None = None) -> AsyncIterator[RequestOutput]:
        """generate() for one conversation, through the chat template."""
        if len(conversation_list(messages)) != 1:
            raise ValueError(f"AsyncLLM.chat takes one conversation (a list of messages), got "
                             f"{len(conversation_list(messages))}: call it once per "
                             "conversation")
        prompt = self.inputs.chat_prompts(messages, chat_template)[0]
        async for out in self.generate(prompt, sampling_params, request_id, priority):
            yield out

    async def abort(self, request_id: str) -> None:
        """Abort a request by the id given to generate(); unknown or finished ids: a no-op."""
        stream = self._live.get(request_id)
        if stream is not None:
            self.client.send_quietly(Abort([stream.key]))

    def stats(self, timeout: float = 30.0) -> dict:
        """The engine's KV blocks (num_blocks, num_free_blocks), live requests, whether it is
        idle, and how many requests were aborted while running. Blocks for one round trip to
        the core (at most a step)."""
        return self.client.stats(timeout)

    def wait_stopped(self) -> None:
        """Block until the engine core has stopped (shut down, or died: then `error` says
        why)."""
        self.client.wait_stopped()

    def shutdown(self) -> None:
        """Stop the engine core (streams still open end with EngineDeadError). Idempotent."""
        self.client.shutdown()
        atexit.unregister(self.shutdown)

    def _add(self, prompt, sp, request_id, priority) -> RequestStream:
        if not self.is_running:
            raise self.client.dead_error()
        if request_id is None:
            request_id = f"req-{next(self._auto_ids)}"
        elif request_id in self._live:
            raise ValueError(f"request_id {request_id!r} is already in use by a running request")
        key = next(self._keys)
        request, text = self.inputs.process(key, prompt, sp, priority)
        state = RequestState(request_id, text, request.prompt_token_ids,
                             request.sampling_params, self.text)
        stream = RequestStream(asyncio.get_running_loop(), key, state)
        # Registered under the client's lock: if the core dies, the stream is failed too.
        try:
            self.client.send(AddRequests([request]),
                             before=lambda: self._streams.__setitem__(key, stream))
        except BaseException:  # the core is gone, or e.g. params that cannot be pickled
            self._streams.pop(key, None)
            raise
        self._live[request_id] = stream
        return stream

    # -- the reader thread's side -----------------------------------------------------------
    def _on_message(self, client, msg: Outputs | Dead) -> None:
        """Hand each stream what the core reported; wake them all, one call per loop."""
        if isinstance(msg, Dead):
            self._fail_all(msg.error)
            return
        touched: dict[int, RequestStream] = {}
        for delta in msg.samples:
            stream = self._streams.get(delta.request_id)
            if stream is not None:
                stream.items.append(delta)
                touched[delta.request_id] = stream
        for end in msg.ended:
            stream = self._streams.pop(end.request_id, None)
            if stream is not None:
                stream.items.append(end)
                stream.done = True
                touched[end.request_id] = stream
        by_loop: dict[asyncio.AbstractEventLoop, list[RequestStream]] = {}
        for stream in touched.values():
            by_loop.setdefault(stream.loop, []).append(stream)
        for loop, streams in by_loop.items():
            wake_soon(loop, streams)

    def _fail_all(self, error: BaseException) -> None:
        streams, self._streams = self._streams, {}
        by_loop: dict = {}
        for stream in streams.values():
            stream.fail(error)
            by_loop.setdefault(stream.loop, []).append(stream)
        for loop, group in by_loop.items():
            wake_soon(loop, group)


def _before_failure(out: RequestOutput) -> RequestOutput | None:
    """The part of a failed request's last delta that came before the failure: its samples'
    new tokens, without the error end (None when there are none)."""
    moved = [replace(c, finish_reason=None, stop_reason=None) if c.finish_reason == "error"
             else c for c in out.outputs if c.token_ids or c.text]
    return replace(out, outputs=moved, finished=False) if moved else None
