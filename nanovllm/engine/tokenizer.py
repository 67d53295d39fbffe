"""The tokenizer side of the engine: loading it, end tokens, and completion text."""
import os

from nanovllm.config import Config
from nanovllm.engine.sequence import Sequence

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


def resolve_eos_ids(config: Config, tokenizer) -> set[int]:
    """config.eos, or (-1) the tokenizer's end token plus config.json's eos_token_id(s)."""
    if config.eos != -1:
        return set(config.eos) if isinstance(config.eos, (list, tuple)) else {config.eos}
    hf_eos = config.hf_config.eos_token_id
    eos = {getattr(tokenizer, "eos_token_id", None)}
    eos |= set(hf_eos) if isinstance(hf_eos, list) else {hf_eos}
    eos.discard(None)
    return eos


class TextDecoder:
    """Completion text of sequences, and stop-string checks, for one tokenizer (or none)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, token_ids: list[int]) -> str:
        """Text of token ids, special tokens dropped ("" without a tokenizer)."""
        if self.tokenizer is None:
            return ""
        # Configs often pad vocab_size past the tokenizer: ids it doesn't know decode to nothing.
        n = len(self.tokenizer)
        return self.tokenizer.decode([t for t in token_ids if t < n], skip_special_tokens=True)

    def stop_string_hit(self, seq: Sequence) -> bool:
        """Whether the end of seq's completion contains one of its stop strings."""
        stops = seq.sampling_params.stop
        window = max(len(s) for s in stops) + 8
        tail = self.decode(seq.completion_token_ids[-window:])
        return any(s in tail for s in stops)

    def completion_text(self, seq: Sequence) -> str:
        """seq's completion text, ending before the first stop string it contains."""
        text = self.decode(seq.completion_token_ids)
        cuts = [text.find(s) for s in seq.sampling_params.stop if s in text]
        return text[: min(cuts)] if cuts else text
