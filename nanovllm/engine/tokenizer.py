"""The tokenizer side of the engine: loading it, end tokens, and completion text."""
import os

from nanovllm.config import Config
from nanovllm.engine.sequence import Sequence

# Files a Hugging Face tokenizer is loaded from; a directory without any of them would give
# an empty tokenizer (transformers does not complain) that turns every prompt into nothing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def load_tokenizer(path: str):
    """AutoTokenizer from a model directory (or a GGUF file's metadata), with a clear error
    when it is missing."""
    from transformers import AutoTokenizer

    from nanovllm.utils.gguf_file import GGUFCheckpoint, is_gguf

    if is_gguf(path):
        return GGUFCheckpoint(path).load_tokenizer()
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
    """config.eos, or (-1) the tokenizer's end token plus config.json's and
    generation_config.json's eos_token_id(s)."""
    if config.eos != -1:
        return set(config.eos) if isinstance(config.eos, (list, tuple)) else {config.eos}
    hf_eos = config.hf_config.eos_token_id
    eos = {getattr(tokenizer, "eos_token_id", None)}
    eos |= set(hf_eos) if isinstance(hf_eos, list) else {hf_eos}
    eos |= set(config.generation_defaults.eos_token_ids)
    eos.discard(None)
    return eos


class TextDecoder:
    """Completion text of sequences, and stop-string checks, for one tokenizer (or none)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._token_texts: dict[int, str] = {}  # at most one entry per vocabulary id

    def token_text(self, token_id: int) -> str | None:
        """One token's text on its own, as vLLM's Logprob.decoded_token has it (special
        tokens kept); "" for an id the tokenizer lacks, None without a tokenizer."""
        if self.tokenizer is None:
            return None
        text = self._token_texts.get(token_id)
        if text is None:
            known = token_id < len(self.tokenizer)
            text = self.tokenizer.decode([token_id]) if known else ""
            self._token_texts[token_id] = text
        return text

    def decode(self, token_ids: list[int]) -> str:
        """Text of token ids, special tokens dropped ("" without a tokenizer)."""
        if self.tokenizer is None:
            return ""
        # Configs often pad vocab_size past the tokenizer: ids it doesn't know decode to nothing.
        n = len(self.tokenizer)
        return self.tokenizer.decode([t for t in token_ids if t < n], skip_special_tokens=True)

    def stop_string_hit(self, seq: Sequence) -> str | None:
        """The stop string the end of seq's completion contains (the one that starts first,
        where the text is cut), or None."""
        stops = seq.sampling_params.stop
        tokens = seq.completion_token_ids
        start = max(len(tokens) - max(len(s) for s in stops) - 8, 0)
        hit = self._first_stop(seq, self.decode(tokens[start:]), tokens, start)
        return None if hit is None else stops[hit[1]]

    def completion_text(self, seq: Sequence) -> str:
        """seq's completion text, ending before the first stop string it contains."""
        tokens = seq.completion_token_ids
        text = self.decode(tokens)
        hit = self._first_stop(seq, text, tokens, 0) if seq.sampling_params.stop else None
        return text if hit is None else text[: hit[0]]

    def _first_stop(self, seq: Sequence, text: str, tokens: list[int],
                    start: int) -> tuple[int, int] | None:
        """(where, which) of the first of seq's stop strings in `text`, the text of
        tokens[start:], or None. As in vLLM, a match counts only if it ends in the text of
        the tokens after the first min_tokens."""
        head = seq.sampling_params.min_tokens
        floor = len(self.decode(tokens[start:head])) if head > start else 0
        found = []
        for i, s in enumerate(seq.sampling_params.stop):
            at = text.find(s, max(floor - len(s) + 1, 0))
            if at != -1:
                found.append((at, i))
        return min(found) if found else None

def render_chat(tokenizer, conversation: list[dict], chat_template: str | None,
                add_generation_prompt: bool) -> str:
    """One conversation as prompt text, through the tokenizer's (or the given) chat template."""
    if tokenizer is None:
        raise ValueError("chat() needs the tokenizer, which skip_tokenizer_init=True turned "
                         "off: apply a chat template yourself and pass token ids to generate()")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: pass one to chat() as "
                         "chat_template=<a Jinja template string>, or use generate() with "
                         "plain prompts")
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(conversation, chat_template=chat_template,
                                             tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except TemplateError as e:
        raise ValueError(f"the chat template failed on this conversation ({e}); check the "
                         f"template and the messages' roles") from e


def chat_prompt(tokenizer, conversation, chat_template: str | None = None,
                add_generation_prompt: bool = True) -> dict:
    """One conversation as a prompt dict: its token ids (the template writes every special
    token, so tokenizing adds none) and its text."""
    text = render_chat(tokenizer, conversation, chat_template, add_generation_prompt)
    return {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False), "prompt": text}
