"""LLMEngine: the step loop (schedule -> run -> postprocess), tokenizer and progress bar."""
import atexit
import logging
import os
from numbers import Integral
from time import perf_counter

from tqdm.auto import tqdm

from nanovllm.config import Config
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.tp import create_runner
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


# Files a Hugging Face tokenizer is loaded from; a directory without any of them would give
# an empty tokenizer (transformers does not complain) that turns every prompt into nothing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def load_tokenizer(path: str):
    """AutoTokenizer from the model directory, with a clear error when it is missing."""
    from transformers import AutoTokenizer

    hint = ("add the tokenizer files of this model, or pass skip_tokenizer_init=True and give "
            "prompts as token ids")
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ValueError(f"{path!r} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is "
                         f"there; {hint}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"could not load a tokenizer from {path!r} ({e}); {hint}") from e
    if len(tokenizer) <= 1:
        raise ValueError(f"the tokenizer in {path!r} is empty ({len(tokenizer)} tokens); {hint}")
    return tokenizer


class LLMEngine:
    """Owns the scheduler, the model runner(s) and the tokenizer."""

    def __init__(self, model: str, **kwargs):
        config = Config.from_kwargs(model, **kwargs)
        self.config = config
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.model)
        if config.eos == -1:
            eos = {getattr(self.tokenizer, "eos_token_id", None)}
            hf_eos = config.hf_config.eos_token_id
            eos |= set(hf_eos) if isinstance(hf_eos, list) else {hf_eos}
            eos.discard(None)
            config.eos = sorted(eos) if eos else -1
        self.model_runner = create_runner(config)
        self.scheduler = Scheduler(config)
        self._closed = False
        atexit.register(self.shutdown)

    # -- lifecycle --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop tensor-parallel workers and free shared memory (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self.model_runner.shutdown()
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
        seqs, is_prefill = self.scheduler.schedule()
        num_tokens = sum(s.num_scheduled_tokens for s in seqs) if is_prefill else -len(seqs)
        token_ids = self.model_runner.call("run", seqs, is_prefill)
        finished = self.scheduler.postprocess(seqs, token_ids)
        for seq in seqs:
            if seq.sampling_params.stop and not seq.is_finished and self._stop_string_hit(seq):
                self.scheduler.finish(seq, "stop")
                finished.append(seq)
        return finished, num_tokens

    def is_finished(self) -> bool:
        """True when no request is waiting or running."""
        return self.scheduler.is_finished()

    # -- text -------------------------------------------------------------------------------
    def _decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        # Configs often pad vocab_size past the tokenizer: ids it doesn't know decode to nothing.
        n = len(self.tokenizer)
        return self.tokenizer.decode([t for t in token_ids if t < n], skip_special_tokens=True)

    def _stop_string_hit(self, seq: Sequence) -> bool:
        stops = seq.sampling_params.stop
        window = max(len(s) for s in stops) + 8
        tail = self._decode(seq.completion_token_ids[-window:])
        return any(s in tail for s in stops)

    def _output(self, seq: Sequence) -> dict:
        text = self._decode(seq.completion_token_ids)
        cuts = [text.find(s) for s in seq.sampling_params.stop if s in text]
        if cuts:
            text = text[: min(cuts)]
        return {"request_id": seq.seq_id, "text": text, "token_ids": seq.completion_token_ids,
                "finish_reason": seq.finish_reason}

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
                else:
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
