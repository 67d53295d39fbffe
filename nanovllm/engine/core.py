"""EngineCore: the step loop (schedule -> launch -> record results) behind add / abort / step.

Every front end drives this one class: LLM steps it on its own thread (InprocClient), or
through a pipe to a child process or a thread (core_loop.py), or in a Ray actor. It sees the
device only through an Executor (executor.py), handed in by whoever built it, and imports no
torch. With async scheduling one step is in flight while the host records the previous one.

Structured output: a request with a grammar waits outside the scheduler until its grammar
has compiled (compiling.py). A step whose batch holds one needs each sequence's previous token
accepted by its matcher before it can sample: where the executor allows (late_masks), its
forward is queued first and its masks filled while the device runs it; otherwise the step
runs synchronously.
"""
import gc
import logging

from nanovllm.config import Config
from nanovllm.engine import logprobs
from nanovllm.engine.compiling import CompilingRequests
from nanovllm.engine.executor import Executor
from nanovllm.engine.messages import Outputs, Request
from nanovllm.engine.reports import Reports
from nanovllm.engine.sampling_rows import grammar_bitmask
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.stop_rules import stop_string_end
from nanovllm.engine.tokenizer import TextDecoder

logger = logging.getLogger(__name__)

# A step that raises fails only its own requests; this many in a row mean the engine itself
# is broken (e.g. the device is gone), and the error propagates.
MAX_STEP_FAILURES = 3


class EngineCore:
    """A scheduler and an executor; requests in, typed outputs out.

    stream=True reports every sample's new tokens after each step (a streaming front end);
    stream=False reports a request once, whole, when it ends (batch generation)."""

    def __init__(self, config: Config, executor: Executor, eos_ids: set[int], tokenizer=None,
                 stream: bool = False, grammars=None):
        """tokenizer: for stop strings only (the front end detokenizes outputs); grammars:
        the structured-output service (structured/grammars.py's Grammars: request(params)
        gives a sequence its grammar state), None without a tokenizer."""
        self.config, self.executor, self.stream = config, executor, stream
        self.grammars = grammars
        self._compiling = CompilingRequests()  # requests waiting for their grammar
        self._structured: set[int] = set()  # ids of the live requests with a grammar
        self.stops = TextDecoder(tokenizer)
        self.scheduler = Scheduler(config, executor.num_kvcache_blocks, eos_ids, streaming=stream)
        executor.set_eos_ids(eos_ids)
        # Overlap host and device work (on by default where it pays: one GPU).
        self.async_scheduling = config.async_scheduling
        if self.async_scheduling is None:
            self.async_scheduling = config.tensor_parallel_size == 1 and executor.on_gpu
        self._in_flight = None  # (Launched, result handle) of the step on the device
        self._aborted: list[Sequence] = []  # aborted samples whose output step() owes
        self._updated: list[Sequence] = []  # samples whose tokens the last step learned
        self._touched: list[Sequence] = []  # sequences of the step under way (see _fail_step)
        self._step_failures = 0  # consecutive steps that raised
        self._reports = Reports(stream, self.scheduler.spec is not None)
        self.num_aborted = 0  # aborts that stopped a live request (stats)
        # What exists now (weights' modules, torch, graphs, tokenizer: ~290k objects) lives as
        # long as the engine: frozen, the collector's full passes stop walking it. Unfrozen,
        # one pass took 127-166 ms of a 1.8 s bench.py run (H200, Qwen2.5-0.5B shape), with
        # the device idle. No gc.collect() first: it left the runs that followed slower.
        gc.freeze()

    # -- requests ---------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request (validated by the front end; the scheduler checks it fits)."""
        seq = Sequence(request.prompt_token_ids, request.sampling_params,
                       self.config.kvcache_block_size, priority=request.priority,
                       request_id=request.request_id)
        structured = request.sampling_params.structured_outputs
        if structured is None:
            self.scheduler.add(seq)
        else:
            if self.grammars is None:
                raise ValueError("structured_outputs needs the tokenizer, which "
                                 "skip_tokenizer_init=True turned off")
            self.scheduler.check(seq)
            seq.grammar = self.grammars.request(structured)
            self._compiling.add(seq)  # the next step admits it once its grammar is ready
            self._structured.add(request.request_id)
        self._reports.live.add(request.request_id)

    def abort(self, request_ids: list[int]) -> None:
        """End these requests now with finish_reason "abort"; the next step() reports them.
        Ids unknown or already ended are ignored."""
        ids = set(request_ids) & self._reports.live
        aborted = self.scheduler.abort(ids) + self._compiling.abort(ids)
        self.num_aborted += len({s.request_id for s in aborted})
        self._aborted += aborted

    def abort_all(self) -> None:
        """Drop every request, reporting none of them (the front end gave them up)."""
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.finish(seq, "abort")
        self._aborted, self._structured = [], set()
        self._compiling.clear()
        self._reports.clear()
        if self._in_flight is not None:  # its results would only land on finished requests
            self._in_flight = None
            self.scheduler.num_in_flight -= 1

    def is_finished(self) -> bool:
        """True when no request is waiting, running or in flight, and step() owes nothing."""
        return (self.scheduler.is_finished() and self._in_flight is None and not self._aborted
                and not self._compiling)

    @property
    def num_live(self) -> int:
        """Requests added and not reported ended."""
        return len(self._reports.live)

    def stats(self) -> dict:
        """KV blocks, queues and counters: what a health check, /metrics or a test looks
        at (the queues count sequences: a request with n > 1 is n of them once forked)."""
        sched = self.scheduler
        bm = sched.block_manager
        stats = dict(num_blocks=bm.num_blocks, num_free_blocks=bm.num_free_blocks,
                     num_live_requests=self.num_live, idle=self.is_finished(),
                     num_aborted=self.num_aborted, num_running=len(sched.running),
                     num_waiting=len(sched.waiting), num_preemptions=sched.num_preemptions,
                     prefix_cache_queries=bm.num_query_tokens,
                     prefix_cache_hits=bm.num_hit_tokens)
        if self.scheduler.spec is not None:
            stats.update(self.scheduler.spec_stats.as_dict())
        return stats

    def shutdown(self) -> None:
        """Release the executor (workers, shared memory); idempotent."""
        gc.unfreeze()  # the engine's objects become collectable again
        self.executor.shutdown()
        if self.grammars is not None:
            self.grammars.shutdown()

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> Outputs:
        """Run one step; returns what it (and aborts since the last step) produced."""
        self._updated, self._touched = [], []
        if self._compiling:  # failed grammars end their requests with "error"
            self._aborted += self._compiling.admit(self.scheduler, self._in_flight is not None)
        finished, num_tokens = [], 0
        if not self.scheduler.is_finished() or self._in_flight is not None:
            finished, num_tokens = self._guarded_step()
        finished, self._aborted = self._aborted + finished, []
        out = self._reports.outputs(num_tokens, self._updated, finished)
        for end in out.ended:
            self._structured.discard(end.request_id)
        return out

    def _guarded_step(self) -> tuple[list[Sequence], int]:
        try:
            result = self._run_step()
        except Exception as e:
            self._step_failures += 1
            if self._step_failures >= MAX_STEP_FAILURES:
                raise  # every step fails: the device is gone, not one batch
            return self._fail_step(e), 0
        self._step_failures = 0
        return result

    def _fail_step(self, error: Exception) -> list[Sequence]:
        """Finish every request of the step that raised (and of a step still in flight)
        with finish_reason "error", its stop_reason the error's text; frees their blocks.
        Returns their samples (ended now)."""
        logger.error("a step failed: its requests end with an error", exc_info=error)
        touched = list(self._touched)
        if self._in_flight is not None:
            touched += self._in_flight[0].seqs
        # Nothing is in flight any more: the failed steps' results would be void anyway.
        self._in_flight = None
        self.scheduler.num_in_flight = 0
        message = f"{type(error).__name__}: {error}"
        return self.scheduler.abort({s.request_id for s in touched}, "error", message)

    def _run_step(self) -> tuple[list[Sequence], int]:
        """schedule -> launch -> record results; the sequences it works on go to _touched."""
        if self._in_flight is not None and self.scheduler.wants_speculation():
            # Drafts come from every token so far: first take the step in flight's results.
            previous, self._in_flight = self._in_flight, None
            self._touched += previous[0].seqs
            return self._results(*previous), 0
        seqs, is_prefill = self.scheduler.schedule()
        self._touched += seqs
        num_tokens = sum(s.num_scheduled_tokens for s in seqs) if is_prefill else -len(seqs)
        # Decode steps while speculating run one at a time: a verify step's accepted drafts
        # must be known before the next step's drafts are proposed. So do steps holding a
        # grammar, unless their masks can come late (after the step in flight's results).
        speculating = not is_prefill and seqs and self.scheduler.wants_speculation()
        grammar = bool(self._structured) and any(s.grammar is not None for s in seqs)
        late = grammar and not speculating and getattr(self.executor, "late_masks", False)
        if not self.async_scheduling or speculating or (grammar and not late):
            handle = self.executor.launch(seqs, is_prefill)
            launched = self.scheduler.on_launch(seqs)
            finished, accepted = [], self.scheduler.spec_stats.accepted
            if self._in_flight is not None:  # rare (after a preemption): its results first
                previous, self._in_flight = self._in_flight, None
                self._touched += previous[0].seqs
                finished = self._results(*previous)
            finished += self._results(launched, handle)
            if not is_prefill:  # what a verify step gained beyond one token a sequence
                num_tokens -= self.scheduler.spec_stats.accepted - accepted
            return finished, num_tokens
        # Async: start this step, then take the previous step's results while the device
        # works; the control plane learns each token one step late.
        launched = None
        if seqs:
            handle = (self.executor.launch(seqs, is_prefill, late_masks=True) if late
                      else self.executor.launch(seqs, is_prefill))
            launched = (self.scheduler.on_launch(seqs), handle)
        previous, self._in_flight = self._in_flight, launched
        finished = []
        if previous is not None:
            self._touched += previous[0].seqs
            finished = self._results(*previous)
        if late:  # the matchers have taken every token: now the masks, then the sampling
            masks = grammar_bitmask(seqs, range(len(seqs)), handle.num_rows)
            self._in_flight = (launched[0], handle.sample(masks))
        return finished, num_tokens

    def _results(self, launched, handle) -> list[Sequence]:
        """Record a step's sampled tokens (and logprobs); returns the sequences that ended."""
        token_ids = handle.result()
        before = ([s.num_tokens - s.num_pending for s in launched.seqs]
                  if launched.speculative else None)
        if handle.logprobs is not None and before is None:
            logprobs.record(launched.seqs, handle.logprobs)
        finished = self.scheduler.on_result(launched, token_ids)
        if handle.logprobs is not None and before is not None:  # as many as it took tokens
            logprobs.record_verified(launched.seqs, handle.logprobs, before)
        self._updated += launched.seqs
        for i, seq in enumerate(launched.seqs):
            sp = seq.sampling_params
            # vLLM's rule: no stop string ends a sequence until it has more than min_tokens.
            if (sp.stop and not seq.is_finished
                    and seq.num_completion_tokens - seq.num_pending > sp.min_tokens):
                stop = stop_string_end(seq, before[i] if before else
                                       seq.num_tokens - seq.num_pending - 1, self.stops)
                if stop is not None:
                    self.scheduler.finish(seq, "stop", stop)
                    finished.append(seq)
        return finished
