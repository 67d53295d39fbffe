"""Input processing, once, on the front side: a prompt (any form generate() takes) and its
sampling params become a validated, tokenized Request; conversations go through the chat
template. The engine core receives only Requests. No torch here."""
from nanovllm.config import Config
from nanovllm.engine.messages import Request
from nanovllm.engine.prompts import (
    check_fits,
    check_priority,
    check_room,
    check_token_ids,
    conversation_list,
    parse_prompt,
)
from nanovllm.engine.tokenizer import chat_prompt
from nanovllm.param_checks import check_text
from nanovllm.sampling_params import SamplingParams


class InputProcessor:
    """Turns prompts into Requests for cores of num_kvcache_blocks blocks (the smallest
    cache among the front end's cores)."""

    def __init__(self, config: Config, tokenizer, num_kvcache_blocks: int,
                 check_structured=None):
        """check_structured: raises ValueError for an invalid StructuredOutputsParams (the
        front end hands in nanovllm.structured.validate; None: the cores find out)."""
        self.config, self.tokenizer = config, tokenizer
        self.num_kvcache_blocks = num_kvcache_blocks
        self.check_structured = check_structured

    def default_params(self) -> SamplingParams:
        """What a request without sampling_params gets: SamplingParams' defaults overridden
        by the model's generation_config.json (see Config.generation_config)."""
        return SamplingParams(**self.config.generation_defaults.sampling)

    def process(self, request_id, prompt, sp: SamplingParams | None,
                priority=0) -> tuple[Request, str | None]:
        """(the Request, the prompt's text if it had one); ValueError naming what is wrong."""
        sp = self.default_params() if sp is None else sp
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
        if sp.structured_outputs is not None:
            if self.tokenizer is None:
                raise ValueError("structured_outputs needs the tokenizer, which "
                                 "skip_tokenizer_init=True turned off")
            if self.check_structured is not None:
                self.check_structured(sp.structured_outputs)
        config = self.config
        check_fits(len(token_ids), sp.max_tokens, config.max_model_len,
                   config.kvcache_block_size, self.num_kvcache_blocks)
        check_room(len(token_ids), sp.max_tokens, config.max_model_len)
        return Request(request_id, token_ids, sp, priority), text

    def chat_prompts(self, messages, chat_template: str | None = None,
                     add_generation_prompt: bool = True) -> list[dict]:
        """One prompt dict (token ids and text) per conversation of `messages` (one
        conversation, or a list of them), through the chat template."""
        conversations = conversation_list(messages)
        if chat_template is not None and not isinstance(chat_template, str):
            raise ValueError(f"chat_template must be None (the tokenizer's) or a Jinja template "
                             f"string, got {type(chat_template).__name__}")
        return [chat_prompt(self.tokenizer, conv, chat_template, add_generation_prompt)
                for conv in conversations]
