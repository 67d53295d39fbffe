"""OpenAI's response shapes: choices, logprobs and usage, built from engine deltas.

A Choice accumulates one completion (one prompt x one sample) as its deltas arrive; the
same object renders a whole response's choice or a stream chunk's, so streamed and unstreamed
responses cannot drift apart.
"""
import time
import uuid

from nanovllm.outputs import CompletionOutput, PositionLogprobs


def new_id(prefix: str) -> str:
    """A response id, e.g. cmpl-3f2a... (OpenAI's style)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def envelope(rid: str, kind: str, model: str, created: int | None = None) -> dict:
    """The fields every response and chunk starts with."""
    return {"id": rid, "object": kind, "created": created or int(time.time()), "model": model}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token(entry: PositionLogprobs, token_id: int) -> tuple[str, float]:
    """The chosen token's text and logprob at one position."""
    chosen = entry[token_id]
    text = chosen.decoded_token
    return (f"token_id:{token_id}" if text is None else text), chosen.logprob


def _text(token_id: int, lp) -> str:
    return f"token_id:{token_id}" if lp.decoded_token is None else lp.decoded_token


class Choice:
    """One completion's text, token count, logprobs and end, as deltas arrive."""

    def __init__(self, index: int, chat: bool, top_logprobs: int | None, tools=None):
        """top_logprobs: None when logprobs are off, else how many top tokens to list;
        tools: a chat's ToolPlan (server/tools.py), whose calls are parsed from the reply."""
        self.index, self.chat, self.k = index, chat, top_logprobs
        self.tools, self.calls = tools, []
        self._content: str | None = None  # with tools: the reply's text outside its calls
        self.text, self.num_tokens, self.finish_reason = "", 0, None
        self.stop_reason: int | str | None = None  # vLLM's extra: the stop string or id hit
        self.logprobs: list = []  # OpenAI-shaped per-token items (chat) or rows (completions)
        # text_offset counts the tokens' own texts (as vLLM does): the visible text can be
        # shorter (a cut stop string) or lag (a split UTF-8 character held back).
        self.token_chars = 0
        # echo (completions): the prompt's text, sent before the first delta's, and its
        # logprob rows (known once the engine reports the prompt logprobs, at the end).
        self.prefix, self.prefix_sent = "", True
        self.prompt_rows: list = []

    def echo(self, prompt_text: str) -> None:
        """Start this completion with its prompt's text (OpenAI's echo)."""
        self.prefix, self.prefix_sent = prompt_text, False

    def echo_logprobs(self, entries: list[PositionLogprobs | None], prompt_ids: list[int],
                      first_token: str) -> None:
        """The prompt's logprob rows for echo: the first token's logprob and top tokens are
        null (it has no context), as OpenAI sends them; first_token: its text."""
        rows, chars = [(first_token, None, None, 0)], len(first_token)
        for entry, tid in zip(entries[1:], prompt_ids[1:]):
            text, logprob = _token(entry, tid)
            rows.append((text, logprob, {_text(t, lp): lp.logprob for t, lp in entry.items()},
                         chars))
            chars += len(text)
        self.prompt_rows = rows

    def add(self, out: CompletionOutput) -> dict:
        """Take one delta; returns the chunk choice for it (streaming)."""
        self.text += out.text
        self.num_tokens += len(out.token_ids)
        if out.finish_reason is not None:
            self.finish_reason = _openai_reason(out.finish_reason)
            self.stop_reason = out.stop_reason
        items = None
        if out.logprobs is not None:
            items = self._logprob_items(out.logprobs, out.token_ids)
            self.logprobs += items
        text = out.text
        if self.tools is not None:
            # Calls are parsed from the whole reply: a stream holds the text back to its end.
            text = self._parse_tools() if out.finish_reason is not None else ""
        elif not self.prefix_sent:
            text, self.prefix_sent = self.prefix + text, True
        return self._render(text, items, self.finish_reason if out.finish_reason else None)

    def final(self) -> dict:
        """The choice of a whole (unstreamed) response, the prompt first with echo."""
        items = None
        if self.k is not None:
            items = self.logprobs
            if self.prompt_rows:  # the generated tokens' offsets come after the prompt's
                shift = self.prompt_rows[-1][3] + len(self.prompt_rows[-1][0])
                items = self.prompt_rows + [(*r[:3], r[3] + shift) for r in items]
        text = self.prefix + self.text if self.tools is None else self._content
        return self._render(text, items, self.finish_reason, whole=True)

    def _parse_tools(self) -> str | None:
        """The reply's content once its tool calls are taken out (finish_reason becomes
        "tool_calls" when there are some)."""
        self._content, self.calls = self.tools.parse(self.text)
        if self.calls and self.finish_reason == "stop":
            self.finish_reason = "tool_calls"
        return self._content

    def _logprob_items(self, entries: list[PositionLogprobs], ids: list[int]) -> list:
        items = []
        for entry, tid in zip(entries, ids):
            text, logprob = _token(entry, tid)
            if self.chat:
                ranked = sorted(entry.items(), key=lambda kv: kv[1].rank or 0)[:self.k]
                top = [{"token": _text(t, lp), "logprob": lp.logprob,
                        "bytes": list(_text(t, lp).encode())} for t, lp in ranked]
                items.append({"token": text, "logprob": logprob, "bytes": list(text.encode()),
                              "top_logprobs": top})
            else:
                top = {_text(t, lp): lp.logprob for t, lp in entry.items()}
                items.append((text, logprob, top, self.token_chars))
                self.token_chars += len(text)
        return items

    def _render(self, text: str, items, finish_reason, whole: bool = False) -> dict:
        if self.chat:
            key = "message" if whole else "delta"
            message = {"role": "assistant", "content": text} if whole else {"content": text}
            if self.calls and (whole or finish_reason):
                message["tool_calls"] = (self.calls if whole else
                                         [{"index": i, **c} for i, c in enumerate(self.calls)])
            body = {key: message}
            logprobs = None if items is None else {"content": items}
        else:
            body = {"text": text}
            logprobs = None if items is None else _completion_logprobs(items)
        return {"index": self.index, **body, "logprobs": logprobs,
                "finish_reason": finish_reason,
                "stop_reason": self.stop_reason if finish_reason else None}


def _completion_logprobs(rows: list[tuple]) -> dict:
    """The legacy completions logprobs object: four parallel lists."""
    return {"tokens": [r[0] for r in rows], "token_logprobs": [r[1] for r in rows],
            "top_logprobs": [r[2] for r in rows], "text_offset": [r[3] for r in rows]}


def _openai_reason(reason: str) -> str:
    # OpenAI knows "stop" and "length"; an aborted request only ends that way when the server
    # itself gave up on it, and the client sees it as stopped.
    return "length" if reason == "length" else "stop"
