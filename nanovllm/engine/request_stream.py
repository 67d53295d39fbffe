"""One request's outputs in transit from the engine core to its consumer: the reader thread
appends the core's items, the consumer's event loop turns them into delta RequestOutputs
(text through TextStream, logprobs, the end). No torch here."""
import asyncio
from collections import deque

from nanovllm.engine import logprobs as lp
from nanovllm.engine.text_stream import TextStream
from nanovllm.engine.tokenizer import TextDecoder
from nanovllm.outputs import CompletionOutput, RequestOutput


class RequestStream:
    """One request's outputs in transit: filled by the reader thread, read on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request_id: str, key: int,
                 text: TextDecoder):
        self.loop, self.request_id, self.key = loop, request_id, key
        self.reply = loop.create_future()  # settled when the core has added the request
        self.answered = False  # whether the core's reply to the add came (reader thread)
        self._text = text
        self._event = asyncio.Event()
        # What the core sent since the last read (deque: appends and pops are atomic under
        # the GIL, a list swap is not).
        self.items: deque = deque()
        self.done = False  # the core has nothing more for this request
        self._error: BaseException | None = None
        # Per sample: its text so far and cumulative logprob.
        self._texts: dict[int, TextStream] = {}
        self._cum: dict[int, float] = {}
        self.prompt: tuple = (None, [])  # (text, token ids), from the core's reply

    def fail(self, error: BaseException) -> None:
        self._error, self.done = error, True

    def wake(self) -> None:
        self._event.set()

    async def next_output(self) -> RequestOutput:
        """The next delta: everything that arrived since the last one."""
        while not self.items and self._error is None:
            self._event.clear()
            await self._event.wait()
        if self._error is not None and not self.items:
            raise self._error
        items = [self.items.popleft() for _ in range(len(self.items))]
        return self._delta(items)

    def _delta(self, items: list) -> RequestOutput:
        parts: dict[int, list] = {}  # sample index -> [ids, entries, text, end]
        finished, prompt_lps = False, None
        for item in items:
            if item[0] == "end":  # the request's end, with its prompt logprobs
                finished, prompt_lps = True, item[1]
                continue
            _, index, ids, entries, stops, end = item
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
        prompt, prompt_ids = self.prompt
        return RequestOutput(request_id=self.request_id, prompt=prompt,
                             prompt_token_ids=prompt_ids, outputs=completions,
                             finished=finished, prompt_logprobs=prompt_lps)
