"""Logical state of one request: its tokens, KV blocks and progress. No torch here."""
from enum import Enum, auto
from itertools import count

from nanovllm.sampling_params import SamplingParams

# Stands in for a token sampled on the device whose value the host does not know yet.
PLACEHOLDER = -1


class SequenceStatus(Enum):
    """Where a sequence is in its life."""

    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """One request: prompt + completion token ids, block table and how much is cached."""

    counter = count()

    def __init__(self, token_ids: list[int], sampling_params: SamplingParams | None = None,
                 block_size: int = 256, *, priority: int = 0, request_id: int | None = None):
        """request_id: the front end's id of the request (default: this seq_id)."""
        self.seq_id = next(Sequence.counter)
        self._request_id = self.seq_id if request_id is None else request_id
        # vLLM's rule: a lower value is scheduled first; ties go by arrival (seq_id).
        self.priority = priority
        self.status = SequenceStatus.WAITING
        self.token_ids = list(token_ids)
        self.last_token = self.token_ids[-1] if self.token_ids else -1
        self.num_tokens = len(self.token_ids)
        self.num_prompt_tokens = self.num_tokens
        self.block_size = block_size
        # Tokens whose K/V already sit in the cache (prefix hits + prefilled chunks).
        self.num_cached_tokens = 0
        # Tokens the current step computes (set by the scheduler, read by the model runner).
        self.num_scheduled_tokens = 0
        self.block_table: list[int] = []
        # Trailing tokens sampled by steps still in flight (async scheduling): their values
        # live on the device until the results come back; PLACEHOLDER stands in for them.
        self.num_pending = 0
        # Speculative decoding: the drafts this step verifies after the last token (set by
        # the scheduler, cleared with the result), the proposer's per-sequence state, and
        # counts for the acceptance metrics.
        self.spec_token_ids: list[int] = []
        self.proposer_state = None
        # Tokens whose K/V a draft model's cache holds (draft_model proposals; see
        # worker/draft.py); reset with the blocks.
        self.num_draft_cached = 0
        self.num_spec_proposed = self.num_spec_accepted = self.num_spec_steps = 0
        self.finish_reason: str | None = None
        # What ended a "stop": the stop token id or stop string (None for an end token).
        self.stop_reason: int | str | None = None
        self.sampling_params = sampling_params or SamplingParams()
        # Structured output: this sequence's grammar state (a structured/grammars.py
        # SequenceGrammar, handed in by the engine core), None when unconstrained.
        self.grammar = None
        # Parallel sampling (n > 1): a request is its first sample (this sequence, index 0);
        # the others are forked from it once its prompt is computed (see spawn_sample).
        self.request: Sequence = self
        self.index = 0
        self.samples: list[Sequence] = [self]  # the request's samples made so far (on index 0)
        # Logprobs, in plain Python as results arrive (None when not asked for): entries
        # (logprob, rank, top-k ids, top-k logprobs), one per generated token, and one per
        # prompt token after a leading None (the first prompt token has no context).
        sp = self.sampling_params
        self.logprobs: list[tuple] | None = None if sp.logprobs is None else []
        self.prompt_logprobs: list[tuple | None] | None = (
            None if sp.prompt_logprobs is None else [None])
        # The next prompt position whose logits a step must compute for prompt logprobs
        # (position p's give token p + 1's); None when they are not asked for.
        self.prompt_logits_next: int | None = None if sp.prompt_logprobs is None else 0

    def __len__(self) -> int:
        return self.num_tokens

    def __getitem__(self, key):
        return self.token_ids[key]

    @property
    def is_finished(self) -> bool:
        """Whether the request has ended."""
        return self.status == SequenceStatus.FINISHED

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Scheduling order: priority (lower first), then arrival of the request, then the
        sample's index (a request's samples stay together, right behind its first)."""
        return self.priority, self.request.seq_id, self.index

    @property
    def request_id(self) -> int:
        """The id of this sample's request (the front end's; its outputs carry it)."""
        return self.request._request_id

    @property
    def needs_fork(self) -> bool:
        """Whether this is a request's first sample and some of its n samples are not made."""
        return self.index == 0 and len(self.samples) < self.sampling_params.n

    @property
    def request_finished(self) -> bool:
        """Whether every sample of this sequence's request has ended."""
        return all(s.is_finished for s in self.request.samples)

    def spawn_sample(self) -> "Sequence":
        """The request's next sample: a new sequence holding the same prompt, with its own
        params (seed + index; see SamplingParams.for_sample). Blocks are the caller's job."""
        index = len(self.samples)
        child = Sequence(self.prompt_token_ids, self.sampling_params.for_sample(index),
                         self.block_size, priority=self.priority)
        child.request, child.index, child.samples = self, index, []
        if self.grammar is not None:  # each sample walks the grammar on its own
            child.grammar = self.grammar.new_sample()
        self.samples.append(child)
        return child

    @property
    def needs_prompt_logits(self) -> bool:
        """Whether prompt positions still need their logits computed for prompt logprobs (if
        so, nothing is read from the prefix cache: cached positions get no logits)."""
        nxt = self.prompt_logits_next
        return nxt is not None and nxt < self.num_prompt_tokens - 1

    def prompt_logit_rows(self) -> tuple[int, int]:
        """(first, count): the scheduled positions, counted from num_cached_tokens, whose
        logits give prompt logprobs in this step (count 0: none)."""
        if self.prompt_logits_next is None:
            return 0, 0
        start = self.num_cached_tokens
        first = max(start, self.prompt_logits_next)  # a recomputed prompt gives none again
        end = min(start + self.num_scheduled_tokens, self.num_prompt_tokens - 1)
        return first - start, max(0, end - first)

    def launch_scheduled(self) -> None:
        """The scheduled tokens are on their way: they count as computed, and the prompt
        logprobs they give as taken care of."""
        if self.prompt_logits_next is not None:  # rarely: keep the per-step path cheap
            first, count = self.prompt_logit_rows()
            if count:
                self.prompt_logits_next = self.num_cached_tokens + first + count
        self.num_cached_tokens += self.num_scheduled_tokens
        self.num_scheduled_tokens = 0

    @property
    def num_completion_tokens(self) -> int:
        """Tokens generated so far."""
        return self.num_tokens - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt's token ids."""
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        """Generated tokens whose values are known (not those still in flight)."""
        return self.token_ids[self.num_prompt_tokens: self.num_tokens - self.num_pending]

    @property
    def num_blocks(self) -> int:
        """Blocks needed to hold every token's K/V."""
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self) -> int:
        """How many tokens the last block holds (1..block_size)."""
        return self.num_tokens - (self.num_blocks - 1) * self.block_size

    def block(self, i: int) -> list[int]:
        """Token ids of logical block i."""
        return self.token_ids[i * self.block_size: (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        """Append a generated token."""
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1

    def append_pending(self) -> None:
        """A step that samples this sequence's next token is on its way."""
        # append_token's body: this runs for every sequence of every step.
        self.token_ids.append(PLACEHOLDER)
        self.last_token = PLACEHOLDER
        self.num_tokens += 1
        self.num_pending += 1

    def fill_pending(self, token_id: int) -> None:
        """The oldest in-flight token's value has arrived."""
        i = self.num_tokens - self.num_pending
        self.token_ids[i] = token_id
        self.num_pending -= 1
        if i == self.num_tokens - 1:
            self.last_token = token_id

    def truncate(self, num_tokens: int) -> None:
        """Keep only the first num_tokens (known) tokens: a stop string ended the sequence
        inside a verify step's tokens. Their K/V stay in blocks the sequence frees next."""
        assert not self.num_pending and num_tokens >= self.num_prompt_tokens
        del self.token_ids[num_tokens:]
        if self.logprobs is not None:
            del self.logprobs[num_tokens - self.num_prompt_tokens:]
        self.num_tokens = num_tokens
        self.num_cached_tokens = min(self.num_cached_tokens, num_tokens)
        self.last_token = self.token_ids[-1]

    def drop_pending(self) -> None:
        """Forget in-flight tokens (the sequence ended before them)."""
        if self.num_pending:
            del self.token_ids[self.num_tokens - self.num_pending:]
            self.num_tokens -= self.num_pending
            self.num_pending = 0
            self.last_token = self.token_ids[-1]

    def __getstate__(self):
        # Sent to tensor-parallel workers every step: ship only what the model runner reads.
        # A decode step needs just the last token; a prefill needs the tokens it computes.
        start, n = self.num_cached_tokens, self.num_scheduled_tokens
        if start == self.num_tokens - 1:  # decode (with drafts, if any: they travel apart)
            tokens = None
        else:
            tokens = self.token_ids[start:start + n]
        # prompt_logits_next: every rank must pick the same rows for the LM head's gather.
        return (self.seq_id, self.num_tokens, self.num_prompt_tokens, self.block_size,
                start, n, self.block_table, self.last_token, tokens, self.prompt_logits_next,
                self.spec_token_ids)

    def __setstate__(self, state):
        (self.seq_id, self.num_tokens, self.num_prompt_tokens, self.block_size,
         self.num_cached_tokens, self.num_scheduled_tokens, self.block_table,
         self.last_token, tokens, self.prompt_logits_next, self.spec_token_ids) = state
        # Workers only see the scheduled slice; pad the front so absolute indexing still works.
        self.token_ids = None if tokens is None else _Window(self.num_cached_tokens, tokens)
        self.status = SequenceStatus.RUNNING
        self.finish_reason = None
        self.sampling_params = None
        self.grammar = None  # rank 0, which samples, keeps the grammars

    def scheduled_token_ids(self) -> list[int]:
        """Token ids this step computes (a prefill chunk, or the last token in decode and
        the drafts it verifies)."""
        start, n = self.num_cached_tokens, self.num_scheduled_tokens
        if self.token_ids is None or start == self.num_tokens - 1:
            return [self.last_token, *self.spec_token_ids]
        return list(self.token_ids[start:start + n])


class _Window:
    """A slice of a token list that keeps absolute indices (for unpickled worker copies)."""

    def __init__(self, offset: int, tokens: list[int]):
        self.offset, self.tokens = offset, tokens

    def __getitem__(self, key: slice) -> list[int]:
        return self.tokens[key.start - self.offset: key.stop - self.offset]
