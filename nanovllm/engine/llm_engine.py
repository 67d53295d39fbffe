"""LLMEngine: the step loop (schedule -> run -> postprocess), tokenizer and progress bar."""
import atexit
import logging
from numbers import Integral
from time import perf_counter

from tqdm.auto import tqdm

from nanovllm.config import Config
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.tokenizer import TextDecoder, load_tokenizer, resolve_eos_ids
from nanovllm.engine.executor import create_executor
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    """Owns the scheduler, the executor (the device side) and the tokenizer."""

    def __init__(self, model: str, **kwargs):
        config = Config.from_kwargs(model, **kwargs)
        self.config = config
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.model)
        self.text = TextDecoder(self.tokenizer)
        self.executor = create_executor(config)
        self.scheduler = Scheduler(config, self.executor.num_kvcache_blocks,
                                   resolve_eos_ids(config, self.tokenizer))
        # Overlap host and device work (on by default where it pays: one GPU).
        self.async_scheduling = config.async_scheduling
        if self.async_scheduling is None:
            self.async_scheduling = config.tensor_parallel_size == 1 and self.executor.on_gpu
        self._in_flight = None  # (Launched, result handle) of the step on the device
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
    def _make_sequence(self, prompt, sp: SamplingParams | None) -> Sequence:
        """Tokenize and validate one request without touching engine state."""
        sp = SamplingParams() if sp is None else sp
        if not isinstance(sp, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams, got {type(sp).__name__}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine was created with skip_tokenizer_init=True: give "
                                 "prompts as lists of token ids, not strings")
            token_ids = self.tokenizer.encode(prompt)
        elif _is_token_ids(prompt):
            token_ids = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
            vocab = self.config.hf_config.vocab_size
            bad = [t for t in token_ids
                   if not isinstance(t, Integral) or isinstance(t, bool) or not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
            token_ids = [int(t) for t in token_ids]
        else:
            raise ValueError(f"a prompt must be a string or a list of token ids, got "
                             f"{type(prompt).__name__}")
        if sp.stop and self.tokenizer is None:
            raise ValueError("stop strings need the tokenizer, which skip_tokenizer_init=True "
                             "turned off: use stop_token_ids")
        seq = Sequence(token_ids, sp, self.config.kvcache_block_size)
        self.scheduler.check(seq)
        return seq

    def add_request(self, prompt: str | list[int],
                    sampling_params: SamplingParams | None = None) -> int:
        """Queue one request; returns its request id (the `request_id` of its output)."""
        seq = self._make_sequence(prompt, sampling_params)
        self.scheduler.add(seq)
        return seq.seq_id

    def step(self) -> tuple[list[dict], int]:
        """Run one step; returns (outputs of the requests that finished in it, tokens: > 0
        prefill, < 0 decode). Outputs are the dicts `generate` returns, with `request_id`."""
        seqs, num_tokens = self._step()
        return [self._output(seq) for seq in seqs], num_tokens

    def _step(self) -> tuple[list[Sequence], int]:
        if self._closed:
            raise RuntimeError("this LLM has been shut down; create a new one")
        seqs, is_prefill = self.scheduler.schedule()
        num_tokens = sum(s.num_scheduled_tokens for s in seqs) if is_prefill else -len(seqs)
        if not self.async_scheduling:
            token_ids = self.executor.run(seqs, is_prefill)
            return self._results(self.scheduler.on_launch(seqs), token_ids), num_tokens
        # Async: start this step, then take the previous step's results while the device
        # works; the control plane learns each token one step late.
        launched = None
        if seqs:
            handle = self.executor.launch(seqs, is_prefill)
            launched = (self.scheduler.on_launch(seqs), handle)
        previous, self._in_flight = self._in_flight, launched
        if previous is None:
            return [], num_tokens
        return self._results(previous[0], previous[1].result()), num_tokens

    def _results(self, launched, token_ids: list[int]) -> list[Sequence]:
        """Record a step's sampled tokens; returns the sequences that finished."""
        finished = self.scheduler.on_result(launched, token_ids)
        for seq in launched.seqs:
            if seq.sampling_params.stop and not seq.is_finished and self.text.stop_string_hit(seq):
                self.scheduler.finish(seq, "stop")
                finished.append(seq)
        return finished

    def is_finished(self) -> bool:
        """True when no request is waiting, running or in flight."""
        return self.scheduler.is_finished() and self._in_flight is None

    # -- outputs ----------------------------------------------------------------------------
    def _output(self, seq: Sequence) -> dict:
        return {"request_id": seq.seq_id, "text": self.text.completion_text(seq),
                "token_ids": seq.completion_token_ids, "finish_reason": seq.finish_reason}

    # -- batch API --------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True) -> list[dict]:
        """Complete every prompt; returns dicts (request_id, text, token_ids, finish_reason) in
        input order. `prompts` is one prompt or an iterable of them (strings or token-id
        lists); `sampling_params` is one SamplingParams or a list with one per prompt."""
        if not self.scheduler.is_finished():
            pending = len(self.scheduler.waiting) + len(self.scheduler.running)
            raise ValueError(f"{pending} request(s) queued with add_request() are still pending: "
                             "finish them with step() until is_finished() (or abort_all()) "
                             "before calling generate(), which would otherwise run them and "
                             "drop their outputs")
        prompts = _prompt_list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for "
                                 f"{len(prompts)} prompts")
            sps = list(sampling_params)
        else:
            sps = [sampling_params] * len(prompts)
        # Validate everything before queueing anything: a bad request leaves no trace.
        seqs = [self._make_sequence(p, sp) for p, sp in zip(prompts, sps)]
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
                bar.update(len(finished))
        except BaseException:
            self.abort_all()
            raise
        finally:
            bar.close()
        return [self._output(seq) for seq in seqs]

    def abort_all(self) -> None:
        """Drop every queued and running request, freeing their blocks."""
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.finish(seq, "abort")
        if self._in_flight is not None:  # its results would only land on finished requests
            self._in_flight = None
            self.scheduler.num_in_flight -= 1


def _is_token_ids(prompt) -> bool:
    """A list/tuple of ids, or a 1-D integer array (numpy or torch)."""
    if isinstance(prompt, (list, tuple)):
        return True
    return getattr(prompt, "ndim", None) == 1 and hasattr(prompt, "tolist")


def _prompt_list(prompts) -> list:
    """generate()'s first argument as a list of prompts: one prompt, or any iterable."""
    if isinstance(prompts, str):
        return [prompts]  # one prompt, as vLLM accepts it: one output
    if prompts is None or isinstance(prompts, (bytes, dict)) or not hasattr(prompts, "__iter__"):
        raise ValueError(f"prompts must be a string or an iterable of prompts (strings or "
                         f"token-id lists), got {type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and isinstance(prompts[0], Integral):
        raise ValueError("prompts is a flat list of token ids: pass a list of prompts, e.g. "
                         "generate([token_ids]) for one token-id prompt")
    return prompts
