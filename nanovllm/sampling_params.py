"""Per-request sampling settings, with vLLM's names and meanings."""
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from nanovllm.param_checks import check_text, is_int, is_real, short
from nanovllm.structured.params import StructuredOutputsParams

# The most top tokens logprobs / prompt_logprobs may ask for (vLLM's default max_logprobs).
MAX_LOGPROBS = 20
# Completions per prompt: a guard against one request filling the engine with samples.
MAX_N = 128
# Stop conditions per request: each stop string is searched for after every token.
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024
# Integers end up in torch int64 tensors (top_k, token ids) or in 64-bit seeds: a larger
# value would raise inside the engine's step instead of here.
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


@dataclass
class SamplingParams:
    """How to pick the next token, when to stop and which logprobs to return;
    `temperature=0` means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    # 0: only the prompt is computed (its prompt_logprobs: scoring), nothing is generated;
    # the request ends with finish_reason "length".
    max_tokens: int = 64
    ignore_eos: bool = False
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    stop: list[str] | str | None = None
    # Completions per prompt. Last, unlike vLLM, so nano-vLLM's positional
    # SamplingParams(temperature, ...) keeps its meaning.
    n: int = 1
    # Penalties and min_tokens, vLLM's (after n, for the same reason). Repetition scales the
    # logits of tokens seen in the prompt or the output; frequency and presence subtract from
    # those of tokens in the output (per occurrence, and once).
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # End tokens and stop ids cannot be sampled (nor stop strings match) before this many.
    min_tokens: int = 0
    # Log probabilities, as vLLM returns them: of the model's raw distribution (log_softmax of
    # its logits, before temperature, top-k/top-p/min-p and penalties). logprobs=k: for each
    # generated token, its logprob and rank plus the k most likely tokens' (0: just its own);
    # prompt_logprobs=k: the same for every prompt token after the first.
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Constrain the output to a JSON schema, regex, choice or grammar (see
    # StructuredOutputsParams; needs `pip install 'nanovllm[structured]'`).
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        self.stop = self._as_list("stop", self.stop, str)
        self.stop_token_ids = self._as_list("stop_token_ids", self.stop_token_ids, int)
        self._check()
        # Plain Python numbers from here on (numpy scalars are accepted above).
        self.temperature, self.top_p, self.min_p = (
            float(self.temperature), float(self.top_p), float(self.min_p))
        self.repetition_penalty, self.presence_penalty, self.frequency_penalty = (
            float(self.repetition_penalty), float(self.presence_penalty),
            float(self.frequency_penalty))
        self.n, self.top_k, self.max_tokens = int(self.n), int(self.top_k), int(self.max_tokens)
        self.min_tokens = int(self.min_tokens)
        self.seed = None if self.seed is None else int(self.seed)
        self.logprobs = None if self.logprobs is None else int(self.logprobs)
        self.prompt_logprobs = None if self.prompt_logprobs is None else int(self.prompt_logprobs)

    @staticmethod
    def _as_list(field: str, value, kind: type) -> list:
        """None, one item or an iterable of items -> a list (numpy integers become ints)."""
        if value is None:
            return []
        if isinstance(value, kind) or (kind is int and is_int(value)):
            value = [value]
        elif isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
            noun = "string" if kind is str else "token id"
            raise ValueError(f"SamplingParams.{field}={value!r} is invalid: must be a {noun} or "
                             f"a list of them.")
        items = list(value)
        if kind is int:
            return [int(t) if is_int(t) else t for t in items]
        return items

    def _check(self):
        def bad(field, value, allowed):
            raise ValueError(f"SamplingParams.{field}={short(value)} is invalid: must be "
                             f"{allowed}.")

        if not is_int(self.n) or not 1 <= self.n <= MAX_N:
            bad("n", self.n, f"an integer in [1, {MAX_N}] (the number of completions per "
                             f"prompt)")
        if not is_real(self.temperature) or not 0 <= self.temperature < math.inf:
            bad("temperature", self.temperature, "a finite number >= 0 (0 means greedy)")
        if not is_real(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "in (0, 1]")
        if (not is_int(self.top_k) or (self.top_k < 1 and self.top_k != -1)
                or self.top_k > INT64_MAX):
            bad("top_k", self.top_k, f"-1 (off) or an integer in [1, {INT64_MAX}]")
        if not is_real(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", self.min_p, "in [0, 1]")
        if not is_int(self.max_tokens) or not 0 <= self.max_tokens <= INT64_MAX:
            bad("max_tokens", self.max_tokens, f"an integer in [0, {INT64_MAX}] (0: compute "
                                               f"the prompt only, e.g. for prompt_logprobs)")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            bad("min_tokens", self.min_tokens, f"an integer in [0, max_tokens={self.max_tokens}]")
        if (not is_real(self.repetition_penalty)
                or not 0 < self.repetition_penalty < math.inf):
            bad("repetition_penalty", self.repetition_penalty, "a finite number > 0 (1 = off)")
        for field in ("presence_penalty", "frequency_penalty"):
            if not is_real(getattr(self, field)) or not -2 <= getattr(self, field) <= 2:
                bad(field, getattr(self, field), "in [-2, 2] (0 = off)")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", self.ignore_eos, "True or False")
        if self.seed is not None and (not is_int(self.seed)
                                      or not INT64_MIN <= self.seed <= INT64_MAX):
            bad("seed", self.seed, f"None or an integer in [{INT64_MIN}, {INT64_MAX}]")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            bad("stop_token_ids", self.stop_token_ids,
                f"at most {MAX_STOP_TOKEN_IDS} token ids (got {len(self.stop_token_ids)})")
        if any(not is_int(t) or not 0 <= t <= INT64_MAX for t in self.stop_token_ids):
            bad("stop_token_ids", self.stop_token_ids, "a list of non-negative token ids")
        if len(self.stop) > MAX_STOP_STRINGS:
            bad("stop", self.stop, f"at most {MAX_STOP_STRINGS} strings (got {len(self.stop)})")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", self.stop, "a string or a list of non-empty strings")
        for i, s in enumerate(self.stop):
            check_text(f"SamplingParams.stop[{i}]", s)
        for field in ("logprobs", "prompt_logprobs"):
            value = getattr(self, field)
            if value is not None and (not is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                bad(field, value, f"None or an integer in [0, {MAX_LOGPROBS}] (how many of the "
                                  f"most likely tokens to return besides the chosen one)")
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            bad("structured_outputs", so, "None or a StructuredOutputsParams")
        if so is not None and self.min_tokens:
            # The grammar decides where the output may end; banning the end tokens on top
            # could leave no token to sample.
            bad("min_tokens", self.min_tokens, "0 with structured_outputs (the grammar decides "
                                               "where the output ends)")

    def for_sample(self, index: int) -> "SamplingParams":
        """The params of parallel sample `index` (n=1): with a seed s, its seed is s + index,
        as vLLM seeds the child requests of n > 1, so samples differ and are reproducible.
        Prompt logprobs belong to the request, which sample 0 carries: the others skip them."""
        seed = None if self.seed is None else self.seed + index
        prompt_logprobs = self.prompt_logprobs if index == 0 else None
        return replace(self, n=1, seed=seed, prompt_logprobs=prompt_logprobs)

    @property
    def penalized(self) -> bool:
        """True when some penalty is on (the logits need the token history)."""
        return (self.repetition_penalty != 1 or self.presence_penalty != 0
                or self.frequency_penalty != 0)

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax."""
        return self.temperature == 0
