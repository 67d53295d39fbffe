"""Streams: several engine requests read as one, and server-sent events that stop (and so
abort their requests) when the client goes away."""
import asyncio
import json
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

_END = object()


async def merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(position, item) from several async iterators as items arrive. Closing this generator
    cancels the readers, which closes each stream (AsyncLLM aborts its request then)."""
    if len(streams) == 1:  # the common case needs no tasks
        try:
            async for item in streams[0]:
                yield 0, item
        finally:
            await streams[0].aclose()  # now, not whenever the garbage collector gets to it
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator) -> None:
        try:
            async for item in stream:
                queue.put_nowait((i, item))
        except Exception as e:  # noqa: BLE001 - handed to the reader, raised there
            queue.put_nowait((i, e))
        queue.put_nowait((i, _END))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is _END:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def sse(payload: dict | str) -> str:
    """One server-sent event: `data: <json>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class EventStream(StreamingResponse):
    """text/event-stream whose body generator is always closed, and cancelled as soon as the
    client disconnects (so the engine requests behind it are aborted at once)."""

    def __init__(self, body: AsyncIterator[str]):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the body until it ends or the client disconnects, whichever comes first."""
        # Watch for the disconnect ourselves: under ASGI spec 2.4 Starlette would not, and a
        # request waiting for its next token would only notice at its next write.
        stream = asyncio.create_task(self.stream_response(send))
        watch = asyncio.create_task(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({stream, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, watch):
                task.cancel()
            await asyncio.gather(stream, watch, return_exceptions=True)
            await self.body_iterator.aclose()
        if stream.done() and not stream.cancelled() and stream.exception() is not None:
            raise stream.exception()
