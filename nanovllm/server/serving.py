"""One OpenAI request served: engine requests started, their deltas turned into a whole
response or a stream of chunks, and the requests aborted if the client leaves first."""
import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from nanovllm.async_llm import AsyncLLM
from nanovllm.sampling_params import SamplingParams
from nanovllm.server.errors import APIError, bad_request, engine_error
from nanovllm.server.metrics import ServerMetrics
from nanovllm.server.responses import Choice, envelope, new_id, usage
from nanovllm.server.streaming import EventStream, merge, sse

# How often an unstreamed request checks that its client is still there.
DISCONNECT_POLL_S = 0.25


async def respond(request: Request, engine: AsyncLLM, model: str, prompts: list[dict],
                  sp: SamplingParams, *, chat: bool, top_logprobs: int | None,
                  stream: bool, include_usage: bool, metrics: ServerMetrics | None = None,
                  echo: list[str] | None = None, tools=None) -> Response:
    """Run one engine request per prompt (choices indexed prompt * n + sample) and answer
    with a JSON response or a server-sent event stream. echo: each prompt's text, to start
    its completions with (and, with logprobs, their rows: sp.prompt_logprobs must be set);
    tools: the chat's ToolPlan (its replies' tool calls are parsed), or None."""
    rid = new_id("chatcmpl" if chat else "cmpl")
    kind = "chat.completion" if chat else "text_completion"
    created = int(time.time())
    choices = [Choice(i, chat, top_logprobs, tools) for i in range(len(prompts) * sp.n)]
    if echo is not None:
        for c in choices:
            c.echo(echo[c.index // sp.n])
    prompt_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    streams = [engine.generate(p, sp, request_id=f"{rid}-{i}") for i, p in enumerate(prompts)]
    if metrics is not None:
        streams = [metrics.track(s, len(p["prompt_token_ids"]), sp.n)
                   for s, p in zip(streams, prompts)]
    outputs = merge(streams)
    # Prompt logprobs come with a request's end: an echo with logprobs also sends each
    # completion whole, in one chunk, once all have ended.
    echo_rows = echo is not None and top_logprobs is not None
    take = _taker(engine, prompts, choices, sp.n, echo_rows)
    if stream:
        chunk_kind = kind + ".chunk"
        return await _stream(outputs, take, choices, chat, include_usage, prompt_tokens,
                             lambda: envelope(rid, chunk_kind, model, created), echo_rows)
    if not await _collect(request, outputs, take):
        return Response(status_code=499)  # nobody reads it; the requests were aborted
    body = envelope(rid, kind, model, created)
    body["choices"] = [c.final() for c in choices]
    body["usage"] = usage(prompt_tokens, sum(c.num_tokens for c in choices))
    return JSONResponse(body)


def _taker(engine: AsyncLLM, prompts: list[dict], choices: list[Choice], n: int,
           echo_rows: bool):
    """take((prompt index, RequestOutput)): the output folded into its prompt's choices,
    returning each moved choice's delta part (echo_rows: the prompt's logprob rows first)."""
    def take(item) -> list[dict]:
        i, out = item
        if echo_rows and out.prompt_logprobs is not None:
            ids = prompts[i]["prompt_token_ids"]
            first = engine.text.token_text(ids[0])
            for c in choices[i * n:(i + 1) * n]:
                c.echo_logprobs(out.prompt_logprobs, ids,
                                f"token_id:{ids[0]}" if first is None else first)
        return [choices[i * n + c.index].add(c) for c in out.outputs]

    return take


async def _stream(outputs: AsyncIterator, take, choices: list[Choice], chat: bool,
                  include_usage: bool, prompt_tokens: int, head, whole: bool) -> EventStream:
    """The streamed answer, once the first delta is in: a request the engine refuses gets a
    plain 400 instead of a stream that carries the error."""
    try:
        first = await outputs.__anext__()
    except Exception as e:
        await outputs.aclose()
        raise _as_api_error(e) from e
    except BaseException:
        await outputs.aclose()
        raise
    return EventStream(_events(outputs, first, take, choices, chat, include_usage, head,
                               prompt_tokens, whole))


async def _collect(request: Request, outputs: AsyncIterator, take) -> bool:
    """Fold every output in (an unstreamed answer); False if the client left first."""
    async def collect() -> None:
        async for item in outputs:
            take(item)

    try:
        return await _unless_client_leaves(request, collect())
    except Exception as e:
        raise _as_api_error(e) from e
    finally:
        await outputs.aclose()


async def _events(outputs: AsyncIterator, first, take, choices: list[Choice], chat: bool,
                  include_usage: bool, head, prompt_tokens: int,
                  whole: bool = False) -> AsyncIterator[str]:
    """The SSE body: one chunk per choice that moved (whole: one per choice at the end),
    [usage], then [DONE]."""
    def chunk(parts: list[dict]) -> str:
        body = head()
        body["choices"] = parts
        if include_usage:
            body["usage"] = None
        return sse(body)

    try:
        if chat:  # OpenAI opens every chat choice with the role
            for c in choices:
                yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}])
        item = first
        while item is not None:
            for part in take(item):
                if _says_something(part) and not whole:
                    yield chunk([part])
            item = await anext(outputs, None)
        if whole:
            for c in choices:
                yield chunk([c.final()])
        if include_usage:
            body = head()
            body["choices"] = []
            body["usage"] = usage(prompt_tokens, sum(c.num_tokens for c in choices))
            yield sse(body)
    except Exception as e:  # noqa: BLE001 - the status is sent already: the error goes in-band
        yield sse(_as_api_error(e).body())
    finally:
        await outputs.aclose()
    yield sse("[DONE]")


def _says_something(part: dict) -> bool:
    """Skip deltas that carry nothing (text held back for a split UTF-8 character)."""
    text = part["delta"].get("content") if "delta" in part else part["text"]
    logprobs = part["logprobs"] or {}
    return (bool(text) or part["finish_reason"] is not None
            or bool(logprobs.get("content") or logprobs.get("tokens")))


async def _unless_client_leaves(request: Request, work) -> bool:
    """Run `work`; cancel it if the client disconnects first. True when it completed."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                task.result()
                return True
            if await request.is_disconnected():
                return False
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _as_api_error(error: Exception) -> APIError:
    """ValueError (the engine refused the request) -> 400; other failures -> 500/503."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, ValueError):
        return bad_request(str(error))
    return engine_error(error)
