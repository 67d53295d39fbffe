"""The tokenizer side of the engine: end tokens, completion text and stop strings, and the
chat template (loading a tokenizer: utils/tokenizer.py). No torch here."""
from nanovllm.config import Config
from nanovllm.sampling_params import SamplingParams


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
        self._vocab = len(tokenizer) if tokenizer is not None else 0
        self._decode = None  # found on first use (a PickledTokenizer unpickles only then)

    def token_text(self, token_id: int) -> str | None:
        """One token's text on its own, as vLLM's Logprob.decoded_token has it (special
        tokens kept); "" for an id the tokenizer lacks, None without a tokenizer."""
        if self.tokenizer is None:
            return None
        text = self._token_texts.get(token_id)
        if text is None:
            known = token_id < self._vocab
            text = self.tokenizer.decode([token_id]) if known else ""
            self._token_texts[token_id] = text
        return text

    def decode(self, token_ids: list[int]) -> str:
        """Text of token ids, special tokens dropped ("" without a tokenizer)."""
        if self.tokenizer is None:
            return ""
        # Configs often pad vocab_size past the tokenizer: ids it doesn't know decode to nothing.
        n = self._vocab
        if self._decode is None:
            self._decode = _fast_decode(self.tokenizer)
        return self._decode([t for t in token_ids if t < n], skip_special_tokens=True)

    def stop_string_hit(self, tokens: list[int], sp: SamplingParams) -> str | None:
        """The stop string the end of a completion (its token ids) contains (the one that
        starts first, where the text is cut), or None."""
        start = max(len(tokens) - max(len(s) for s in sp.stop) - 8, 0)
        hit = self._first_stop(sp, self.decode(tokens[start:]), tokens, start)
        return None if hit is None else sp.stop[hit[1]]

    def completion_text(self, tokens: list[int], sp: SamplingParams) -> str:
        """A completion's text, ending before the first stop string it contains."""
        text = self.decode(tokens)
        hit = self._first_stop(sp, text, tokens, 0) if sp.stop else None
        return text if hit is None else text[: hit[0]]

    def _first_stop(self, sp: SamplingParams, text: str, tokens: list[int],
                    start: int) -> tuple[int, int] | None:
        """(where, which) of the first of sp's stop strings in `text`, the text of
        tokens[start:], or None. As in vLLM, a match counts only if it ends in the text of
        the tokens after the first min_tokens."""
        head = sp.min_tokens
        floor = len(self.decode(tokens[start:head])) if head > start else 0
        found = []
        for i, s in enumerate(sp.stop):
            at = text.find(s, max(floor - len(s) + 1, 0))
            if at != -1:
                found.append((at, i))
        return min(found) if found else None


def _fast_decode(tokenizer):
    """tokenizer.decode, or the same decode without transformers' wrapper where that gives
    the same text. A streaming server decodes a few-token window per stream per delta, and
    the wrapper cost ~3x the Rust decode it ends in (H100 host, a 256-stream burst: 15% of the
    API process's CPU against 4%). Its one extra step is the clean-up of spaces, which a
    tokenizer without that setting skips."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True) is not False:
        return tokenizer.decode
    return backend.decode


def render_chat(tokenizer, conversation: list[dict], chat_template: str | None,
                add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
    """One conversation as prompt text, through the tokenizer's (or the given) chat template
    (tools: OpenAI's tool definitions, for templates that render them)."""
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
                                             tokenize=False, tools=tools,
                                             add_generation_prompt=add_generation_prompt)
    except TemplateError as e:
        raise ValueError(f"the chat template failed on this conversation ({e}); check the "
                         f"template and the messages' roles") from e


def chat_prompt(tokenizer, conversation, chat_template: str | None = None,
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> dict:
    """One conversation as a prompt dict: its token ids (the template writes every special
    token, so tokenizing adds none) and its text."""
    text = render_chat(tokenizer, conversation, chat_template, add_generation_prompt, tools)
    return {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False), "prompt": text}
