"""Completion text produced a piece at a time, for streaming. No torch here.

Decoding the whole completion after every token costs O(length) per token. Instead each
update decodes a short window: the text of the tokens since `read`, minus the text of the
tokens between `prefix` and `read` (the window keeps one step of context so a token whose
text depends on its neighbour, e.g. a leading space, comes out right). While the window's
text ends in U+FFFD the last token is an incomplete UTF-8 sequence: its text waits for the
next token. Stop strings need their own hold-back: the last len(longest stop) - 1 characters
might begin a stop string, which the final text cuts, so they are not sent until the
sequence moves past them or ends. The final piece comes from the engine's full decode of the
completion (TextDecoder.completion_text), so a finished stream always adds up to the
offline text.
"""


class TextStream:
    """The text of one completion, handed out as deltas while its tokens arrive."""

    def __init__(self, decode, stops: list[str] | None = None):
        """decode(token_ids) -> str: the engine's decode (special tokens skipped)."""
        self._decode = decode
        self.token_ids: list[int] = []
        self._prefix = self._read = 0  # the decode window: [prefix, read) is its context
        self._text = ""  # the text decoded so far
        self._sent = 0  # how much of it was handed out
        self._hold = max((len(s) for s in stops), default=1) - 1 if stops else 0

    def add(self, token_ids: list[int]) -> str:
        """Take new tokens; returns the text that may be sent now ("" if none yet)."""
        if token_ids:
            self.token_ids += token_ids
            self._advance()
        end = len(self._text) - self._hold
        if end <= self._sent:
            return ""
        delta, self._sent = self._text[self._sent:end], end
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of the completion, given its whole text: what was not sent yet."""
        sent = self._text[: self._sent]
        # The windows decode exactly like the whole for byte-level BPE tokenizers; for others
        # the final text wins from the first place they differ (what was sent stays sent).
        common = len(sent) if final_text.startswith(sent) else _common_prefix(sent, final_text)
        self._sent = len(self._text)
        return final_text[common:]

    def _advance(self) -> None:
        ids = self.token_ids
        context = self._decode(ids[self._prefix: self._read]) if self._read > self._prefix else ""
        window = self._decode(ids[self._prefix:])
        if len(window) > len(context) and not window.endswith("\ufffd"):
            self._text += window[len(context):]
            self._prefix, self._read = self._read, len(ids)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
