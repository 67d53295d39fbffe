"""What crosses between a front end (LLM, AsyncLLM) and an engine core: typed messages.

The same types travel in-process (a core stepped on the caller's thread), over a pipe (a core
in a child process or on a thread) and through Ray (a core in an actor); the receiver
dispatches on the type, never on a string tag. No torch here.

Front end -> core: AddRequests, Abort, StatsQuery, Stop.
Core -> front end: Ready (first), Outputs, Stats, Dead (last).
"""
from dataclasses import dataclass, field
from typing import NamedTuple

from nanovllm.engine.logprobs import Entry
from nanovllm.sampling_params import SamplingParams


@dataclass
class Request:
    """One request, as the front end made it: validated and tokenized (see inputs.py)."""

    request_id: int  # the front end's id: every output of the request carries it
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    priority: int = 0


class SampleDelta(NamedTuple):
    """What one sample of a request learned since the core last reported it: new token ids
    (and their logprob entries), and why it ended once it has. A NamedTuple, not a
    dataclass: one is made per live sample per step, and a tuple is built and pickled in a
    fraction of a dataclass's time."""

    request_id: int
    index: int  # the sample's place among the request's n
    token_ids: list[int]
    logprobs: list[Entry] | None  # one entry per token id; None unless asked for
    finish_reason: str | None = None  # "stop", "length", "abort", "error"; None: running
    stop_reason: int | str | None = None  # the stop token id or stop string, or the error


class RequestEnd(NamedTuple):
    """A request ended (all its samples): what the front end needs beyond its samples."""

    request_id: int
    finish_reason: str  # the first sample's; what samples never forked end with
    prompt_logprobs: list[Entry | None] | None  # entries of the prompt positions computed
    # Speculative decoding, over the request's samples: (drafts proposed, accepted, verify
    # steps with drafts); None when speculation is off.
    spec_counts: tuple[int, int, int] | None = None


# -- front end -> core ----------------------------------------------------------------------
@dataclass
class AddRequests:
    """Queue these requests (in order)."""

    requests: list[Request]


@dataclass
class Abort:
    """Abort these requests now; each ends with finish_reason "abort" (unknown ids: none)."""

    request_ids: list[int]


@dataclass
class StatsQuery:
    """Ask for the core's stats; the reply is the Stats with the same token."""

    token: int


@dataclass
class Stop:
    """Stop the core (what is still running is dropped)."""


@dataclass
class Tokenizer:
    """The end-token ids and tokenizer (a PickledTokenizer, or None) of a core started before
    the front end had loaded them: the first command it reads (AsyncLLM loads its tokenizer
    while the engine process builds the model)."""

    eos_ids: set[int]
    tokenizer: object


# -- core -> front end ----------------------------------------------------------------------
@dataclass
class Ready:
    """The core is built and serving: what the front end needs to validate requests."""

    num_kvcache_blocks: int


@dataclass
class Outputs:
    """What one or more steps produced: samples that moved or ended, requests that ended
    (after their samples' last deltas), and the step's tokens (> 0 prefill, < 0 decode;
    one step's only, in-process)."""

    samples: list[SampleDelta] = field(default_factory=list)
    ended: list[RequestEnd] = field(default_factory=list)
    num_tokens: int = 0

    def extend(self, other: "Outputs") -> None:
        """Append another batch (the core sends several steps' outputs at once under load)."""
        self.samples += other.samples
        self.ended += other.ended

    def coalesce(self) -> None:
        """Merge each sample's deltas into one (in place): a few steps sent at once then
        cost their receiver one delta per sample to unpickle and decode, not one per step."""
        at: dict[tuple[int, int], int] = {}
        merged: list[SampleDelta] = []
        for delta in self.samples:
            key = (delta.request_id, delta.index)
            i = at.get(key)
            if i is None:
                at[key] = len(merged)
                merged.append(delta)
                continue
            first = merged[i]
            entries = first.logprobs if delta.logprobs is None else \
                (first.logprobs or []) + delta.logprobs
            merged[i] = SampleDelta(first.request_id, first.index,
                                    first.token_ids + delta.token_ids, entries,
                                    delta.finish_reason, delta.stop_reason)
        self.samples = merged

    def __bool__(self) -> bool:
        return bool(self.samples or self.ended)


@dataclass
class Stats:
    """The reply to StatsQuery(token)."""

    token: int
    stats: dict


@dataclass
class Dead:
    """The core stopped: on `error`, or None for a clean stop. Nothing follows it."""

    error: BaseException | None = None


FrontMessage = AddRequests | Abort | StatsQuery | Stop
CoreMessage = Ready | Outputs | Stats | Dead
