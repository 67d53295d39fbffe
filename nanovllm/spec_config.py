"""Speculative decoding's settings (`LLM(speculative_config={...})`, vLLM's shape). No torch.

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
     "prompt_lookup_min": 2}
    {"method": "draft_model", "model": "/path/to/small-model", "num_speculative_tokens": 4}
"""
from dataclasses import dataclass

METHODS = ("ngram", "draft_model")
# A verify step computes k + 1 rows per sequence: past a few tokens the acceptance odds of
# the last drafts are too low to pay for their rows.
MAX_SPECULATIVE_TOKENS = 16
# Speculation pays while a step is bound by reading the weights (small batches): above this
# many running sequences the engine decodes one token a step. On the H100 (README) n-gram
# drafts still gained at batch 1 on every prompt set, and at batch 8 lost on open-ended text
# (0.69x): the default sits between.
DEFAULT_DISABLE_BY_BATCH_SIZE = 4

_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model",
         "disable_by_batch_size")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are proposed and how many; validated from the user's dict."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    model: str | None = None
    # Speculate only while at most this many sequences run (vLLM's name).
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE

    @classmethod
    def from_dict(cls, d) -> "SpeculativeConfig":
        """Parse `speculative_config`; a ValueError names the key, the value and the fix."""
        if isinstance(d, SpeculativeConfig):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"speculative_config={d!r} must be a dict such as "
                             "{'method': 'ngram', 'num_speculative_tokens': 4}")
        unknown = sorted(set(d) - set(_KEYS))
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: "
                             f"{list(_KEYS)}")
        method = d.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config['method']={method!r} must be one of "
                             f"{METHODS}")
        k = _int(d, "num_speculative_tokens", None, 1, MAX_SPECULATIVE_TOKENS)
        hi = _int(d, "prompt_lookup_max", None, 1)
        lo = _int(d, "prompt_lookup_min", None, 1)
        # One bound given: the other follows it (vLLM's rule); neither: 2..4.
        hi = hi if hi is not None else max(lo or 0, 4)
        lo = lo if lo is not None else min(hi, 2)
        if lo > hi:
            raise ValueError(f"speculative_config: prompt_lookup_min={lo} is above "
                             f"prompt_lookup_max={hi}; make min <= max")
        model = d.get("model")
        if method == "draft_model" and not isinstance(model, str):
            raise ValueError(f"speculative_config['model']={model!r}: method 'draft_model' "
                             "needs the draft model's path (it must share the tokenizer)")
        if method == "ngram" and model is not None:
            raise ValueError("speculative_config['model'] is for method 'draft_model'; the "
                             "'ngram' method proposes from the request's own tokens")
        limit = _int(d, "disable_by_batch_size", DEFAULT_DISABLE_BY_BATCH_SIZE, 1)
        return cls(method, k, hi, lo, model, limit)


def _int(d: dict, key: str, default, lo: int, hi: int | None = None):
    v = d.get(key, default)
    if v is None and default is None and key != "num_speculative_tokens":
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"speculative_config[{key!r}]={v!r} must be an integer {rng}")
    return v
