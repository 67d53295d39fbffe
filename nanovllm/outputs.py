"""What generate(), chat() and step() return, with vLLM's names (no torch here).

A RequestOutput also reads like nano-vLLM's output dict: out["text"], out["token_ids"],
out["finish_reason"] and out["request_id"] (the first three from its first completion).
"""
from collections.abc import Mapping
from dataclasses import dataclass, field, fields


@dataclass
class CompletionOutput:
    """One completion of a request: its text, token ids and why it ended."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # not computed yet
    logprobs: None = None  # not computed yet
    finish_reason: str | None = None  # "stop", "length", "abort", or None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        """Whether this completion has ended."""
        return self.finish_reason is not None


# The keys of nano-vLLM's output dict, read from the first completion except request_id.
_DICT_KEYS = ("request_id", "text", "token_ids", "finish_reason")


@dataclass(eq=False)
class RequestOutput(Mapping):
    """One request's prompt and completions; also a read-only nano-vLLM output dict."""

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False

    # -- nano-vLLM's dict view (Mapping gives keys/items/values/get/in/==) -------------------
    def __getitem__(self, key: str):
        if key == "request_id":
            return self.request_id
        if key in _DICT_KEYS:
            return getattr(self.outputs[0], key)
        raise KeyError(f"{key!r}: a RequestOutput reads as a dict with the keys "
                       f"{', '.join(_DICT_KEYS)}; use attributes (out.prompt, "
                       f"out.outputs[0].stop_reason, ...) for the rest")

    def __iter__(self):
        return iter(_DICT_KEYS)

    def __len__(self) -> int:
        return len(_DICT_KEYS)

    def __eq__(self, other) -> bool:
        if isinstance(other, RequestOutput):
            return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self))
        if isinstance(other, Mapping):  # an output dict of nano-vLLM's kind
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # mutable, like a dict
