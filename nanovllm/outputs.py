"""What generate(), chat() and step() return, with vLLM's names (no torch here).

A RequestOutput also reads like nano-vLLM's output dict: out["text"], out["token_ids"],
out["finish_reason"] and out["request_id"] (the first three from its first completion).

Logprobs follow vLLM: one {token id: Logprob} dict per position, holding the chosen token
(the sampled one, or the prompt's) first, then the top-k tokens; k or k + 1 entries.
"""
from collections.abc import Mapping
from dataclasses import dataclass, field, fields


@dataclass
class Logprob:
    """One token's log probability under the model's raw distribution, and its rank there."""

    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None  # None without a tokenizer (skip_tokenizer_init=True)


# One position's logprobs: the chosen token's and the top-k tokens', by token id.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One completion of a request: its text, token ids and why it ended."""

    index: int
    text: str
    token_ids: list[int]
    # The sum of the generated tokens' logprobs, and one dict per generated token; both None
    # unless SamplingParams.logprobs was set.
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", or None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        """Whether this completion has ended."""
        return self.finish_reason is not None


@dataclass
class SpecMetrics:
    """Speculative decoding for one request (all its samples): drafts proposed and accepted,
    the verify steps that carried drafts, and what they amount to."""

    num_draft_tokens: int
    num_accepted_tokens: int
    num_verify_steps: int

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts (0 when none was proposed)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verify step with drafts gained on average: 1 + accepted drafts."""
        steps = self.num_verify_steps
        return 1 + self.num_accepted_tokens / steps if steps else 0.0


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
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (it
    # has no context) and a dict for each other; else None.
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    # With speculative decoding, once the request finished; else None.
    spec_metrics: SpecMetrics | None = None

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
