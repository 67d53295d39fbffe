"""Per-request sampling settings, with vLLM's names and meanings."""
from dataclasses import dataclass


@dataclass
class SamplingParams:
    """How to pick the next token and when to stop; `temperature=0` means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 64
    ignore_eos: bool = False
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    stop: list[str] | str | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if self.stop else []
        self.stop_token_ids = list(self.stop_token_ids) if self.stop_token_ids else []
        self._check()

    def _check(self):
        def bad(field, value, allowed):
            raise ValueError(f"SamplingParams.{field}={value!r} is invalid: must be {allowed}.")

        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            bad("temperature", self.temperature, "a number >= 0 (0 means greedy)")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or (
            self.top_k < 1 and self.top_k != -1
        ):
            bad("top_k", self.top_k, "-1 (off) or an integer >= 1")
        if not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            bad("min_p", self.min_p, "in [0, 1]")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or (
            self.max_tokens < 1
        ):
            bad("max_tokens", self.max_tokens, "an integer >= 1")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            bad("seed", self.seed, "None or an integer")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", self.stop_token_ids, "a list of non-negative token ids")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", self.stop, "a string or a list of non-empty strings")

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax."""
        return self.temperature == 0
