"""One request's outputs in transit from the engine core to its consumer: the client's reader
thread appends what the core reported, the consumer's event loop turns it into the next delta
RequestOutput (output_processor.py). No torch here."""
import asyncio
from collections import deque

from nanovllm.engine.messages import RequestEnd
from nanovllm.engine.output_processor import RequestState
from nanovllm.outputs import RequestOutput


class RequestStream:
    """One request's outputs in transit: filled by the reader thread, read on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: int, state: RequestState):
        self.loop, self.key, self.state = loop, key, state
        self._event = asyncio.Event()
        # What the core sent since the last read (deque: appends and pops are atomic under
        # the GIL, a list swap is not).
        self.items: deque = deque()
        self.done = False  # the core has nothing more for this request
        self._error: BaseException | None = None

    @property
    def request_id(self) -> str:
        """The request's id as the caller gave it."""
        return self.state.request_id

    def fail(self, error: BaseException) -> None:
        """End the stream with error: the reader's next_output raises it."""
        self._error, self.done = error, True

    def wake(self) -> None:
        """Wake the reader waiting in next_output (call on the loop's thread)."""
        self._event.set()

    async def next_output(self) -> RequestOutput:
        """The next delta: everything that arrived since the last one."""
        while not self.items and self._error is None:
            self._event.clear()
            await self._event.wait()
        if self._error is not None and not self.items:
            raise self._error
        items = [self.items.popleft() for _ in range(len(self.items))]
        end = items.pop() if isinstance(items[-1], RequestEnd) else None
        return self.state.output(items, end)


def wake_soon(loop: asyncio.AbstractEventLoop, streams: list[RequestStream]) -> None:
    """Wake every stream in the list on its loop: one cross-thread call for all of them;
    nothing if the loop was closed (nobody listens)."""
    try:
        loop.call_soon_threadsafe(_wake_all, streams)
    except RuntimeError:
        pass


def _wake_all(streams: list[RequestStream]) -> None:
    for stream in streams:
        stream.wake()
