"""LLMEngine: the step loop (schedule -> run -> postprocess), tokenizer and progress bar."""
import atexit
import logging
from collections.abc import Iterable
from numbers import Integral
from time import perf_counter

from tqdm.auto import tqdm

from nanovllm.config import Config
from nanovllm.engine import logprobs
from nanovllm.engine.prompts import (check_priority, check_room, check_token_ids, generate_args,
                                     parse_prompt)
from nanovllm.engine.request_outputs import finished_requests, request_output
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.tokenizer import TextDecoder, load_tokenizer, resolve_eos_ids
from nanovllm.worker import create_executor
from nanovllm.outputs import RequestOutput
from nanovllm.sampling_params import SamplingParams, check_text

logger = logging.getLogger(__name__)

# A step that raises fails only its own requests; this many in a row mean the engine itself
# is broken (e.g. the device is gone), and the error propagates.
MAX_STEP_FAILURES = 3


class LLMEngine:
    """Owns the scheduler, the executor (the device side) and the tokenizer."""

    def __init__(self, model: str, **kwargs):
        config = Config.from_kwargs(model, **kwargs)
        if config.data_parallel_size != 1 or config.distributed_executor_backend != "mp":
            raise ValueError("an LLMEngine is one replica: data_parallel_size and "
                             "distributed_executor_backend='ray' are for LLM(...), which "
                             "starts the replicas")
        self.config = config
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.tokenizer)
        self.text = TextDecoder(self.tokenizer)
        self.executor = create_executor(config)
        eos_ids = resolve_eos_ids(config, self.tokenizer)
        self.scheduler = Scheduler(config, self.executor.num_kvcache_blocks, eos_ids)
        self.executor.set_eos_ids(eos_ids)
        # Overlap host and device work (on by default where it pays: one GPU).
        self.async_scheduling = config.async_scheduling
        if self.async_scheduling is None:
            self.async_scheduling = config.tensor_parallel_size == 1 and self.executor.on_gpu
        self._in_flight = None  # (Launched, result handle) of the step on the device
        self._aborted: list[Sequence] = []  # aborted requests whose output step() owes
        self._updated: list[Sequence] = []  # samples whose tokens the last step learned
        self._touched: list[Sequence] = []  # sequences of the step under way (see _fail_step)
        self._step_failures = 0  # consecutive steps that raised
        self._closed = False
        atexit.register(self.shutdown)

    # -- lifecycle --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop tensor-parallel workers and free shared memory (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self.executor.shutdown()
        atexit.unregister(self.shutdown)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # -- requests ---------------------------------------------------------------------------
    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without sampling_params gets (vLLM's name): SamplingParams' defaults
        overridden by the model's generation_config.json (see Config.generation_config)."""
        return SamplingParams(**self.config.generation_defaults.sampling)

    def _make_sequence(self, prompt, sp: SamplingParams | None, priority=0) -> Sequence:
        """Tokenize and validate one request without touching engine state."""
        sp = self.get_default_sampling_params() if sp is None else sp
        if not isinstance(sp, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams, got {type(sp).__name__}")
        priority = check_priority(priority)
        text, token_ids = parse_prompt(prompt)
        if text is not None:
            check_text("prompt", text)
        if token_ids is None:
            if self.tokenizer is None:
                raise ValueError("this engine was created with skip_tokenizer_init=True: give "
                                 "prompts as token ids (a list, or {'prompt_token_ids': [...]}), "
                                 "not text")
            token_ids = self.tokenizer.encode(text)
        else:
            token_ids = check_token_ids(token_ids, self.config.hf_config.vocab_size)
        if sp.stop and self.tokenizer is None:
            raise ValueError("stop strings need the tokenizer, which skip_tokenizer_init=True "
                             "turned off: use stop_token_ids")
        seq = Sequence(token_ids, sp, self.config.kvcache_block_size, priority=priority,
                       prompt=text)
        self.scheduler.check(seq)
        check_room(len(token_ids), sp.max_tokens, self.config.max_model_len)
        return seq

    def add_request(self, prompt, sampling_params: SamplingParams | None = None,
                    priority: int = 0) -> int:
        """Queue one request; returns its request id (the `request_id` of its output).
        `prompt` takes any form generate() accepts for one prompt; a lower `priority` is
        scheduled first (ties by arrival)."""
        return self.add_sequence(prompt, sampling_params, priority).seq_id

    def add_sequence(self, prompt, sampling_params: SamplingParams | None = None,
                     priority: int = 0) -> Sequence:
        """add_request, returning the request's Sequence (read it on the engine's thread)."""
        seq = self._make_sequence(prompt, sampling_params, priority)
        self.scheduler.add(seq)
        return seq

    def abort_request(self, request_id: int | Iterable[int]) -> None:
        """Stop one request id or several now and free their KV blocks; each ends with
        finish_reason "abort", its output returned by the next step(). Ids that are unknown
        or already finished are ignored (as in vLLM)."""
        ids = [request_id] if isinstance(request_id, Integral) else request_id
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise ValueError(f"request_id must be a request id (the int add_request returned) "
                             f"or a list of them, got {type(request_id).__name__}")
        ids = list(ids)
        bad = [i for i in ids if not isinstance(i, Integral) or isinstance(i, bool)]
        if bad:
            raise ValueError(f"request ids are the ints add_request returned; got {bad[:5]!r}")
        self._aborted += self.scheduler.abort({int(i) for i in ids})

    def step(self) -> tuple[list[RequestOutput], int]:
        """Run one step; returns (outputs of the requests that finished in it or were aborted
        since the last step, tokens: > 0 prefill, < 0 decode). Outputs are the RequestOutputs
        `generate` returns; a request with n > 1 comes back once, when its last sample ends."""
        seqs, num_tokens = self._step()
        seqs, self._aborted = self._aborted + seqs, []
        return [request_output(req, self.text) for req in finished_requests(seqs)], num_tokens

    def step_updates(self) -> tuple[list[Sequence], list[Sequence]]:
        """Run one step for a streaming front end (AsyncLLM); returns (the samples whose
        known tokens grew in it, the requests that ended in it or were aborted since the last
        step). The sequences are the engine's own: read them on the engine's thread only."""
        finished, _ = self._step()
        finished, self._aborted = self._aborted + finished, []
        return self._updated, finished_requests(finished)

    def _step(self) -> tuple[list[Sequence], int]:
        if self._closed:
            raise RuntimeError("this LLM has been shut down; create a new one")
        self._updated, self._touched = [], []
        if self.scheduler.is_finished() and self._in_flight is None:
            return [], 0  # nothing to do (e.g. every request was aborted)
        try:
            result = self._run_step()
        except Exception as e:  # noqa: BLE001 - the step's requests fail, the engine lives
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
        seqs, is_prefill = self.scheduler.schedule()
        self._touched += seqs
        num_tokens = sum(s.num_scheduled_tokens for s in seqs) if is_prefill else -len(seqs)
        if not self.async_scheduling:
            handle = self.executor.launch(seqs, is_prefill)
            return self._results(self.scheduler.on_launch(seqs), handle), num_tokens
        # Async: start this step, then take the previous step's results while the device
        # works; the control plane learns each token one step late.
        launched = None
        if seqs:
            handle = self.executor.launch(seqs, is_prefill)
            launched = (self.scheduler.on_launch(seqs), handle)
        previous, self._in_flight = self._in_flight, launched
        if previous is None:
            return [], num_tokens
        self._touched += previous[0].seqs
        return self._results(*previous), num_tokens

    def _results(self, launched, handle) -> list[Sequence]:
        """Record a step's sampled tokens (and logprobs); returns the sequences that ended."""
        token_ids = handle.result()
        if handle.logprobs is not None:
            logprobs.record(launched.seqs, handle.logprobs)
        finished = self.scheduler.on_result(launched, token_ids)
        self._updated += launched.seqs
        for seq in launched.seqs:
            sp = seq.sampling_params
            # vLLM's rule: no stop string ends a sequence until it has more than min_tokens.
            if (sp.stop and not seq.is_finished
                    and seq.num_completion_tokens - seq.num_pending > sp.min_tokens):
                stop = self.text.stop_string_hit(seq)
                if stop is not None:
                    self.scheduler.finish(seq, "stop", stop)
                    finished.append(seq)
        return finished

    def is_finished(self) -> bool:
        """True when no request is waiting, running or in flight, and step() owes no output."""
        return self.scheduler.is_finished() and self._in_flight is None and not self._aborted

    # -- batch API --------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True,
                 priority: list[int] | None = None) -> list[RequestOutput]:
        """Complete every prompt; returns RequestOutputs in input order. `prompts` is one
        prompt or an iterable of them (strings, token-id lists, {"prompt": ...} or
        {"prompt_token_ids": ...} dicts); `sampling_params` is one SamplingParams or a list
        with one per prompt; `priority` is None or a list with one int per prompt."""
        if not self.is_finished():
            live = (*self.scheduler.waiting, *self.scheduler.running, *self._aborted)
            pending = len({s.request_id for s in live})
            raise ValueError(f"{pending} request(s) queued with add_request() are still pending "
                             "(an aborted one until step() has returned its output): finish "
                             "them with step() until is_finished() (or abort_all()) before "
                             "calling generate(), which would otherwise drop their outputs")
        prompts, sps, priorities = generate_args(prompts, sampling_params, priority)
        # Validate everything before queueing anything: a bad request leaves no trace.
        seqs = [self._make_sequence(p, sp, pr) for p, sp, pr in zip(prompts, sps, priorities)]
        for seq in seqs:
            self.scheduler.add(seq)
        bar = tqdm(total=len(seqs), desc="Generating", dynamic_ncols=True, disable=not use_tqdm)
        prefill_tps = decode_tps = 0.0
        try:
            while not self.is_finished():
                t = perf_counter()
                finished, num_tokens = self._step()
                dt = perf_counter() - t
                if num_tokens > 0:
                    prefill_tps = num_tokens / dt
                elif num_tokens < 0:
                    decode_tps = -num_tokens / dt
                # refresh=False: redraw at tqdm's own pace, not on every step.
                bar.set_postfix(prefill=f"{prefill_tps:.0f}tok/s", decode=f"{decode_tps:.0f}tok/s",
                                refresh=False)
                failed = next((s for s in finished if s.finish_reason == "error"), None)
                if failed is not None:
                    raise RuntimeError(f"a step of this generate() call failed, so it was "
                                       f"stopped: {failed.stop_reason}")
                bar.update(len(finished_requests(finished)))
        except BaseException:
            self.abort_all()
            raise
        finally:
            bar.close()
        return [request_output(seq, self.text) for seq in seqs]

    def abort_all(self) -> None:
        """Drop every queued and running request, freeing their blocks; unlike
        abort_request, their outputs are dropped too (step() returns none of them)."""
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.finish(seq, "abort")
        self._aborted = []
        if self._in_flight is not None:  # its results would only land on finished requests
            self._in_flight = None
            self.scheduler.num_in_flight -= 1


