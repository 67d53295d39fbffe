"""Decides which sequences run each step. No torch here.

Policy (nano-vLLM's, plus chunked prefill and vLLM's priorities; README "Scheduling policy"):
both queues are kept in (priority, arrival) order. Mixed steps (the default, as vLLM V1 and
SGLang schedule): every running sequence whose prompt is computed decodes one token, then the
token budget left (at most max_mixed_prefill_tokens while something decodes) goes to partly
computed prompts, then to waiting requests, admitted while blocks and `max_num_seqs` allow (a
longer prompt is cut into chunks). Without mixed steps (or while speculating: verify steps
stay pure decode) a step is all prefill or all decode, prefill first. Without a free block
for a decode, the last running sequence in that order is preempted (blocks freed, recomputed
later in its place in the waiting queue); a step that preempted admits nobody. Parallel
sampling (n > 1): a request's other samples are forked when its prompt is computed (forks.py).
"""
from collections import deque

from nanovllm.engine.admission import schedule_prompts
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.forks import fork_samples
from nanovllm.engine.prompts import check_fits
from nanovllm.engine.queues import insert_in_order
from nanovllm.engine.sequence import Sequence, SequenceStatus
from nanovllm.engine.speculation import SpecStats, Speculator, take_verified
from nanovllm.engine.stop_rules import length_done, take_sampled

# A streaming front end's default max_mixed_prefill_tokens: a chunk's compute is then about a
# full decode step's (Qwen3-0.6B on an H100: ~8 ms each at 256 streams), so arriving prompts at
# most double a running stream's step instead of stalling it for a 16k-token prefill.
STREAMING_MIXED_PREFILL_TOKENS = 2048


class Scheduler:
    """Waiting/running queues, step batches, preemption and finishing."""

    def __init__(self, config, num_kvcache_blocks: int, eos_ids: set[int],
                 streaming: bool = False):
        """config: the engine's limits; the block count and end tokens are what the engine
        found out (the executor's cache, the tokenizer and config.json). streaming: a front
        end that reports every token (its default prompt budget beside decodes is smaller)."""
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.mixed = getattr(config, "enable_mixed_steps", True)
        cap = getattr(config, "max_mixed_prefill_tokens", None)
        if cap is None:
            cap = STREAMING_MIXED_PREFILL_TOKENS if streaming else self.max_num_batched_tokens
        self.max_mixed_prefill_tokens = min(cap, self.max_num_batched_tokens)
        self.max_model_len = config.max_model_len
        # Models may name several end tokens (Qwen3: <|im_end|> and <|endoftext|>).
        self.eos_ids = set(eos_ids)
        self.block_manager = BlockManager(num_kvcache_blocks, config.kvcache_block_size,
                                          config.enable_prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0  # a statistic, for logs and tests
        self.num_mixed_steps = 0  # a statistic: steps that decoded and computed prompt chunks
        self.num_in_flight = 0  # launched steps whose results have not come back
        # Speculative decoding (n-gram drafts); None: off.
        self.spec = getattr(config, "speculative_config", None)
        self.speculator = None if self.spec is None else Speculator(
            self.spec, self.block_manager, self.max_model_len)
        self.spec_stats = SpecStats()

    def is_finished(self) -> bool:
        """Whether no request waits or runs."""
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        """Queue a request, rejecting one that could never complete."""
        self.check(seq)
        seq.status = SequenceStatus.WAITING
        insert_in_order(self.waiting, seq)

    def check(self, seq: Sequence) -> None:
        """Raise ValueError if seq could never complete with this cache and max_model_len."""
        check_fits(seq.num_tokens, seq.sampling_params.max_tokens, self.max_model_len,
                   self.block_manager.block_size, self.block_manager.num_blocks)

    # -- scheduling -------------------------------------------------------------------------
    def schedule(self) -> tuple[list[Sequence], bool]:
        """Pick this step's sequences; returns (seqs, is_prefill). A prefill step computes
        prompt chunks on the varlen path; a mixed one is a prefill step whose leading
        sequences decode (one token each, their prompts computed)."""
        if self.mixed and not self.wants_speculation():
            return self._schedule_mixed()
        seqs = self._schedule_prefill(self.max_num_batched_tokens)
        if seqs:
            return seqs, True
        seqs = self._schedule_decode()
        if seqs:
            return seqs, False
        return self._after_preemptions()

    def _schedule_mixed(self) -> tuple[list[Sequence], bool]:
        """Decodes first, then prompt chunks in the budget they leave."""
        preemptions = self.num_preemptions
        decodes = self._schedule_decode(mixed=True)
        if not decodes:
            seqs = self._schedule_prefill(self.max_num_batched_tokens)
            return (seqs, True) if seqs else self._after_preemptions()
        # The decode rows wait for the chunks: a smaller budget beside them (see
        # STREAMING_MIXED_PREFILL_TOKENS); nobody is admitted right after a preemption.
        budget = min(self.max_num_batched_tokens - len(decodes), self.max_mixed_prefill_tokens)
        chunks = self._schedule_prefill(budget, admit=self.num_preemptions == preemptions)
        self.num_mixed_steps += bool(chunks)
        return decodes + chunks, bool(chunks)

    def _after_preemptions(self) -> tuple[list[Sequence], bool]:
        # Decode preempted everything it held: the freed blocks let a prefill start now.
        seqs = self._schedule_prefill(self.max_num_batched_tokens)
        if not seqs and not self.num_in_flight:
            raise RuntimeError("scheduler made no progress (internal error)")
        # Empty while steps are in flight: what is left waits for their results.
        return seqs, True

    def _schedule_prefill(self, budget: int, admit: bool = True) -> list[Sequence]:
        return schedule_prompts(self.running, self.waiting, self.block_manager, budget,
                                self.max_num_seqs, admit)

    def wants_speculation(self) -> bool:
        """Whether the next decode step would verify drafts: speculation is on, few enough
        sequences run for it to pay and none needs what verify steps lack (it needs every
        token on the host: the caller takes a step in flight first)."""
        sp = self.speculator
        return sp is not None and sp.wanted(self.running) and sp.allowed(self.running, True)

    def _schedule_decode(self, mixed: bool = False) -> list[Sequence]:
        """One token for each running sequence whose prompt is computed (mixed: the others,
        partly computed prompts, are left to _schedule_prefill)."""
        scheduled, kept = [], []
        limit = min(self.max_num_seqs, self.max_num_batched_tokens)
        # Rows a verify step may add beyond one per sequence (the token budget bounds them).
        spare = (self.max_num_batched_tokens - min(len(self.running), limit)
                 if not mixed and self.wants_speculation()
                 and self.speculator.allowed(self.running) else 0)
        try_append, max_len = self.block_manager.try_append, self.max_model_len  # hoisted
        while self.running and len(scheduled) < limit:
            seq = self.running.popleft()
            if (seq.num_pending and length_done(seq, max_len)) or (
                    mixed and seq.num_tokens - seq.num_cached_tokens > 1):
                # Its pending token is its last (it ends with its result), or its prompt is
                # still being computed.
                kept.append(seq)
                continue
            # running is in priority order and seq came off its front: the sequences still
            # in it rank lowest, so the victim is the last of them (or seq itself).
            while not try_append(seq):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    self.preempt(seq)
                    break
            else:
                seq.num_scheduled_tokens = 1
                if spare > 0:
                    spare -= self.speculator.draft(seq, spare, keep=len(self.running))
                scheduled.append(seq)
                kept.append(seq)
        self.running.extendleft(reversed(kept))
        return scheduled

    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks and put it back in line (by priority and arrival, so with equal
        priorities ahead of every request not yet admitted) to be recomputed."""
        seq.status = SequenceStatus.WAITING
        seq.num_scheduled_tokens = 0
        self.num_preemptions += 1
        self.block_manager.deallocate(seq)
        insert_in_order(self.waiting, seq)

    # -- after the model ran ----------------------------------------------------------------
    def on_launch(self, seqs: list[Sequence]) -> "Launched":
        """The step is on its way: its tokens count as computed, and each sequence whose
        prompt is now complete gets a pending token (its value comes with on_result)."""
        produced, speculative = [], False
        for seq in seqs:
            if seq.spec_token_ids:  # only the last token's K/V is sure to be kept
                seq.num_scheduled_tokens, speculative = 1, True
            seq.launch_scheduled()
            # A prefill chunk that leaves part of the prompt uncomputed samples nothing real.
            real = seq.num_cached_tokens >= seq.num_tokens
            if real:
                seq.append_pending()
                if seq.needs_fork:
                    fork_samples(seq, self.running, self.waiting, self.block_manager,
                                 self.max_num_seqs)
            produced.append(real)
        self.num_in_flight += 1
        return Launched(seqs, produced, speculative)

    def on_result(self, launched: "Launched", token_ids: list) -> list[Sequence]:
        """A launched step's sampled tokens arrived (a verify step: a list per sequence, its
        accepted drafts and one more); returns the sequences that finished."""
        self.num_in_flight -= 1
        finished = []
        # Hoisted: this loop runs for every sequence of every step.
        commit, eos_ids, max_len = self.block_manager.commit, self.eos_ids, self.max_model_len
        speculative, done = launched.speculative, SequenceStatus.FINISHED
        for seq, real, out in zip(launched.seqs, launched.produced, token_ids):
            if seq.status is done:
                continue  # it ended at an earlier token: this step's work is void
            if not real:
                commit(seq)
                continue
            if speculative:
                reason, stop_reason = take_verified(seq, out, eos_ids, max_len, self.spec_stats)
            else:
                reason, stop_reason = take_sampled(seq, out, eos_ids, max_len)
            commit(seq)  # after the fill: every hashed token is known
            if reason is not None:
                if seq.status is SequenceStatus.WAITING:  # preempted while in flight
                    self.waiting.remove(seq)
                self._finish(seq, reason, stop_reason)
                finished.append(seq)
        if finished:
            self.running = deque(s for s in self.running if not s.is_finished)
        return finished

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        seq.drop_pending()
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self.block_manager.deallocate(seq)  # a waiting sequence holds none: a no-op

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """End a running or waiting sequence early (a stop string matched, or an abort)."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            self.running = deque(s for s in self.running if s is not seq)
        self._finish(seq, reason, stop_reason)

    def abort(self, request_ids: set[int], reason: str = "abort",
              stop_reason: str | None = None) -> list[Sequence]:
        """Finish every waiting and running sample of the requests with these ids (with
        `reason`: "abort", or "error" when their step failed), freeing their blocks now;
        returns them. Ids of finished or unknown requests are ignored. A step in flight that
        holds one of them is harmless: on_result skips finished sequences, and a request's
        unforked samples are never made."""
        seqs = [s for s in (*self.running, *self.waiting) if s.request_id in request_ids]
        for seq in seqs:
            self.finish(seq, reason, stop_reason)
        return seqs


class Launched:
    """A step on its way: its sequences, which of them sample a real next token, and
    whether it verifies drafts (its results are then a list of tokens per sequence)."""

    __slots__ = ("produced", "seqs", "speculative")

    def __init__(self, seqs: list[Sequence], produced: list[bool], speculative: bool = False):
        self.seqs, self.produced, self.speculative = seqs, produced, speculative

